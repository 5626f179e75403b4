//! Links `libegpu.so` with a version script that defines the glibc version
//! nodes our exported `dlsym` and `dlopen` are bound to (`dlsym@GLIBC_2.2.5`
//! and the default `dlsym@@GLIBC_2.34`, the same for `dlopen`; see
//! `src/dlsym.rs`, `src/dlopen.rs`), and sets the soname.
//!
//! rustc passes its own anonymous version script for the cdylib's exports;
//! lld (rustc's default linker on x86_64-unknown-linux-gnu since 1.90)
//! accepts a second script that only declares version nodes. On other
//! targets we ask for lld explicitly.

fn main() {
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    let script = std::path::Path::new(&out).join("egpu-glibc-versions.map");
    // The oldest dlsym version of the target (see src/dlsym.rs), then 2.34.
    let base = if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("aarch64") { "GLIBC_2.17" } else { "GLIBC_2.2.5" };
    std::fs::write(&script, format!("{base} {{ }};\nGLIBC_2.34 {{ }} {base};\n")).expect("write version script");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={}", script.display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libegpu.so");
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() != Ok("x86_64") {
        println!("cargo:rustc-cdylib-link-arg=-fuse-ld=lld");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
