//! Builds what `egpu-probe --via direct` links against:
//! - stub `libcuda.so` (soname `libcuda.so.1`) and `libnvidia-ml.so` (soname
//!   `libnvidia-ml.so.1`) exporting every symbol of `symbols.txt`. They are
//!   only for the link; at run time the real or simulated driver is found on
//!   the library path, exactly like a program built with the CUDA toolkit.
//! - `libprobedirect.a`: a table of the symbols' addresses taken through
//!   *weak* references from the executable, so the probe starts even when a
//!   driver lacks some of them, and `LD_PRELOAD` interposition applies.
//!
//! Needs a C compiler (`$CC` or `cc`).

use std::path::Path;
use std::process::Command;

fn cc(args: &[&str]) {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc).args(args).status().unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(st.success(), "{cc} {args:?} failed");
}

fn main() {
    println!("cargo:rerun-if-changed=symbols.txt");
    println!("cargo:rerun-if-changed=build.rs");
    let out = std::env::var("OUT_DIR").expect("OUT_DIR");
    let out = Path::new(&out);
    let text = std::fs::read_to_string("symbols.txt").expect("symbols.txt");
    let syms: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')).map(|l| l.split_whitespace().next().expect("elf name")).collect();
    for (lib, soname, prefix) in [("libcuda.so", "libcuda.so.1", "cu"), ("libnvidia-ml.so", "libnvidia-ml.so.1", "nvml")] {
        let c = out.join(format!("{lib}.c"));
        let body: String = syms.iter().filter(|s| s.starts_with(prefix) && (prefix != "cu" || !s.starts_with("nvml"))).map(|s| format!("int {s}(void) {{ return 34; }}\n")).collect();
        std::fs::write(&c, body).expect("write stub");
        let so = out.join(lib);
        cc(&["-shared", "-fPIC", "-o", so.to_str().unwrap(), &format!("-Wl,-soname,{soname}"), c.to_str().unwrap()]);
    }
    let mut t = String::from("struct sym { const char *name; void *addr; };\n");
    for s in &syms {
        t += &format!("#pragma weak {s}\nextern int {s}(void);\n");
    }
    t += "const struct sym egpu_probe_direct[] = {\n";
    for s in &syms {
        t += &format!("  {{\"{s}\", (void *){s}}},\n");
    }
    t += "};\nconst unsigned egpu_probe_direct_len = sizeof egpu_probe_direct / sizeof egpu_probe_direct[0];\n";
    let tc = out.join("direct.c");
    std::fs::write(&tc, t).expect("write table");
    let obj = out.join("direct.o");
    cc(&["-c", "-fPIC", "-o", obj.to_str().unwrap(), tc.to_str().unwrap()]);
    let ar = std::env::var("AR").unwrap_or_else(|_| "ar".into());
    let lib = out.join("libprobedirect.a");
    let _ = std::fs::remove_file(&lib);
    let st = Command::new(&ar).args(["crs", lib.to_str().unwrap(), obj.to_str().unwrap()]).status().expect("ar");
    assert!(st.success(), "ar failed");
    println!("cargo:rustc-link-search=native={}", out.display());
    // The probe needs the driver at run time, like any CUDA program. Not
    // `--push-state`: zig's linker (the glibc 2.17 build,
    // scripts/build-compat.sh) lacks it; rustc links with `--as-needed`, so
    // ending with it restores what was in force. One argument each: zig's
    // wrapper refuses libraries inside `-Wl,`.
    for arg in ["-Wl,--no-as-needed", "-lcuda", "-lnvidia-ml", "-Wl,--as-needed"] {
        println!("cargo:rustc-link-arg-bin=egpu-probe={arg}");
    }
}
