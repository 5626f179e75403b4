//! The check a slice's CDI spec runs as a `createRuntime` hook
//! (`egpu-cdi-hook`), before the container's first process: can the image's
//! dynamic loader load `libegpu.so`? If it cannot (a glibc older than the
//! hook needs, a musl or static image), the loader would only print a warning
//! and run every program without the hook, unlimited; the check stops the
//! container instead, with the reason.
//!
//! It compares what `libegpu.so` needs (its `DT_VERNEED`: each library and
//! the symbol versions wanted from it, e.g. `libc.so.6` `GLIBC_2.34`) with
//! what the image's copy of each library defines (its `DT_VERDEF`), found in
//! the image's library directories. Paths are resolved inside the image's
//! root (`openat2` with `RESOLVE_IN_ROOT`), so an image's absolute symlinks
//! stay in the image.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not an ELF shared library this check can read: {why}")]
    Elf { path: PathBuf, why: String },
    #[error("the OCI state on stdin is not valid: {0}")]
    State(String),
    #[error(
        "the image has no {lib} in {dirs}, and libegpu.so needs it (a musl or static image has no glibc libraries), so no program of this container could be held to its slice"
    )]
    Missing { lib: String, dirs: String },
    #[error(
        "the image's {lib} ({path}) lacks {missing}, which libegpu.so needs (it needs {needed}); its programs would run without the hook, unlimited. Use an image with a newer C library (glibc 2.34 or later for the hook as built here)"
    )]
    TooOld { lib: String, path: String, missing: String, needed: String },
}

/// The library directories searched in the image, in order.
fn lib_dirs() -> Vec<String> {
    let triple = format!("{}-linux-gnu", std::env::consts::ARCH);
    vec![format!("lib/{triple}"), format!("usr/lib/{triple}"), "lib64".into(), "usr/lib64".into(), "lib".into(), "usr/lib".into()]
}

/// One library a shared object needs, with the versions it wants from it
/// (weak requirements left out: the loader does not insist on them).
#[derive(Debug, PartialEq, Eq)]
pub struct Need {
    pub lib: String,
    pub versions: BTreeSet<String>,
}

type Header = object::elf::FileHeader64<object::Endianness>;

fn elf_err(path: &Path, e: impl std::fmt::Display) -> CheckError {
    CheckError::Elf { path: path.into(), why: e.to_string() }
}

type Sections<'a> = object::read::elf::SectionTable<'a, Header, &'a [u8]>;

/// The section table of the 64-bit ELF object `data`.
fn sections<'a>(path: &Path, data: &'a [u8]) -> Result<(object::Endianness, Sections<'a>), CheckError> {
    use object::read::elf::FileHeader;
    let hdr = Header::parse(data).map_err(|e| elf_err(path, e))?;
    let endian = hdr.endian().map_err(|e| elf_err(path, e))?;
    Ok((endian, hdr.sections(endian, data).map_err(|e| elf_err(path, e))?))
}

/// What the shared object `data` (read from `path`) needs.
pub fn needs(path: &Path, data: &[u8]) -> Result<Vec<Need>, CheckError> {
    let (endian, sections) = sections(path, data)?;
    let mut out = Vec::new();
    let Some((mut it, link)) = sections.gnu_verneed(endian, data).map_err(|e| elf_err(path, e))? else { return Ok(out) };
    let strings = sections.strings(endian, data, link).map_err(|e| elf_err(path, e))?;
    while let Some((need, mut aux)) = it.next().map_err(|e| elf_err(path, e))? {
        let lib = String::from_utf8_lossy(need.file(endian, strings).map_err(|e| elf_err(path, e))?).into_owned();
        let mut versions = BTreeSet::new();
        while let Some(a) = aux.next().map_err(|e| elf_err(path, e))? {
            if a.vna_flags.get(endian) & object::elf::VER_FLG_WEAK == 0 {
                versions.insert(String::from_utf8_lossy(a.name(endian, strings).map_err(|e| elf_err(path, e))?).into_owned());
            }
        }
        out.push(Need { lib, versions });
    }
    Ok(out)
}

/// The symbol versions the shared object `data` defines.
pub fn defines(path: &Path, data: &[u8]) -> Result<BTreeSet<String>, CheckError> {
    let (endian, sections) = sections(path, data)?;
    let mut out = BTreeSet::new();
    let Some((mut it, link)) = sections.gnu_verdef(endian, data).map_err(|e| elf_err(path, e))? else { return Ok(out) };
    let strings = sections.strings(endian, data, link).map_err(|e| elf_err(path, e))?;
    while let Some((_, mut aux)) = it.next().map_err(|e| elf_err(path, e))? {
        while let Some(a) = aux.next().map_err(|e| elf_err(path, e))? {
            out.insert(String::from_utf8_lossy(a.name(endian, strings).map_err(|e| elf_err(path, e))?).into_owned());
        }
    }
    Ok(out)
}

/// Reads `rel` (relative to the image root) with every symlink resolved
/// inside `root`; `Ok(None)` when there is no such file.
fn read_in_root(root: &std::fs::File, root_path: &Path, rel: &str) -> Result<Option<Vec<u8>>, CheckError> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let shown = root_path.join(rel);
    let fd = match rustix::fs::openat2(root, rel, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty(), ResolveFlags::IN_ROOT) {
        Ok(fd) => fd,
        // What the loader could not open either (a loop of links counts).
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => return Ok(None),
        // Kernels before 5.6: a plain open (an image's absolute symlink may then point out of it).
        Err(rustix::io::Errno::NOSYS) => match std::fs::File::open(&shown) {
            Ok(f) => f.into(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(CheckError::Read { path: shown, source }),
        },
        Err(e) => return Err(CheckError::Read { path: shown, source: e.into() }),
    };
    let mut data = Vec::new();
    std::fs::File::from(fd).read_to_end(&mut data).map_err(|source| CheckError::Read { path: shown, source })?;
    Ok(Some(data))
}

/// Checks that the image rooted at `rootfs` can load the hook `hook_lib`.
pub fn check_rootfs(rootfs: &Path, hook_lib: &Path) -> Result<(), CheckError> {
    let hook = std::fs::read(hook_lib).map_err(|source| CheckError::Read { path: hook_lib.into(), source })?;
    let root = std::fs::File::open(rootfs).map_err(|source| CheckError::Read { path: rootfs.into(), source })?;
    let dirs = lib_dirs();
    for need in needs(hook_lib, &hook)? {
        let mut found = None;
        for d in &dirs {
            let rel = format!("{d}/{}", need.lib);
            if let Some(data) = read_in_root(&root, rootfs, &rel)? {
                found = Some((rel, data));
                break;
            }
        }
        let Some((rel, data)) = found else {
            return Err(CheckError::Missing { lib: need.lib, dirs: dirs.iter().map(|d| format!("/{d}")).collect::<Vec<_>>().join(", ") });
        };
        let have = defines(&rootfs.join(&rel), &data)?;
        let missing: Vec<&String> = need.versions.iter().filter(|v| !have.contains(*v)).collect();
        if !missing.is_empty() {
            let join = |v: Vec<&String>| v.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ");
            return Err(CheckError::TooOld { lib: need.lib.clone(), path: format!("/{rel}"), missing: join(missing), needed: join(need.versions.iter().collect()) });
        }
    }
    Ok(())
}

/// The container's root file system, from the OCI state a hook reads on
/// stdin: `<bundle>/config.json`'s `root.path`, relative to the bundle
/// unless absolute.
pub fn rootfs_of_state(state: &str) -> Result<PathBuf, CheckError> {
    let v: serde_json::Value = serde_json::from_str(state).map_err(|e| CheckError::State(e.to_string()))?;
    let bundle = PathBuf::from(v["bundle"].as_str().ok_or_else(|| CheckError::State("no \"bundle\"".into()))?);
    let config = bundle.join("config.json");
    let text = std::fs::read_to_string(&config).map_err(|source| CheckError::Read { path: config.clone(), source })?;
    let c: serde_json::Value = serde_json::from_str(&text).map_err(|e| CheckError::State(format!("{}: {e}", config.display())))?;
    let root = c["root"]["path"].as_str().ok_or_else(|| CheckError::State(format!("{} has no root.path", config.display())))?;
    Ok(bundle.join(root))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The running test binary links libc.so.6: its needs and the host libc's definitions.
    #[test]
    fn reads_needs_and_definitions_of_real_objects() {
        let exe = std::env::current_exe().unwrap();
        let n = needs(&exe, &std::fs::read(&exe).unwrap()).unwrap();
        let libc = n.iter().find(|n| n.lib == "libc.so.6").unwrap_or_else(|| panic!("{n:?}"));
        assert!(libc.versions.contains("GLIBC_2.2.5") || libc.versions.contains("GLIBC_2.17"), "{libc:?}");
        // The host's own libc defines everything the binary needs from it.
        let root = Path::new("/");
        let f = std::fs::File::open(root).unwrap();
        let (rel, data) = lib_dirs().iter().find_map(|d| read_in_root(&f, root, &format!("{d}/libc.so.6")).unwrap().map(|x| (d.clone(), x))).unwrap();
        let have = defines(&root.join(rel), &data).unwrap();
        assert!(libc.versions.is_subset(&have), "{libc:?} vs {have:?}");
        assert!(matches!(needs(&exe, b"not an elf"), Err(CheckError::Elf { .. })));
    }

    /// The host's copy of `lib`.
    fn host_lib(lib: &str) -> PathBuf {
        lib_dirs().into_iter().map(|d| Path::new("/").join(d).join(lib)).find(|p| p.exists()).unwrap_or_else(|| panic!("no host {lib}"))
    }

    /// An image root holding, for every library the test binary needs, what
    /// `put` makes of the host's copy.
    fn image(put: impl Fn(&str, &Path, &Path)) -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(format!("lib/{}-linux-gnu", std::env::consts::ARCH));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = std::env::current_exe().unwrap();
        for n in needs(&exe, &std::fs::read(&exe).unwrap()).unwrap() {
            put(&n.lib, &host_lib(&n.lib), &dir.join(&n.lib));
        }
        (tmp, exe)
    }

    #[test]
    fn an_image_with_the_libraries_passes_and_symlinks_stay_inside_it() {
        let (copies, exe) = image(|_, host, at| {
            std::fs::copy(host, at).unwrap();
        });
        check_rootfs(copies.path(), &exe).unwrap();
        // Absolute links to the host's libraries point, inside the image, at
        // nothing: the image has no C library.
        let (links, exe) = image(|_, host, at| std::os::unix::fs::symlink(std::fs::canonicalize(host).unwrap(), at).unwrap());
        let err = check_rootfs(links.path(), &exe).unwrap_err();
        assert!(matches!(&err, CheckError::Missing { .. }) && err.to_string().contains("musl or static image"), "{err}");
    }

    #[test]
    fn an_image_whose_libc_is_too_old_is_refused_with_the_missing_versions() {
        let (tmp, exe) = image(|lib, host, at| {
            if lib != "libc.so.6" {
                std::fs::copy(host, at).unwrap();
                return;
            }
            // A libc.so.6 that defines only GLIBC_2.2.5, built with the C compiler.
            let src = at.with_file_name("old.c");
            let map = at.with_file_name("old.map");
            std::fs::write(&src, "int old_libc_marker(void) { return 1; }\n").unwrap();
            std::fs::write(&map, "GLIBC_2.2.5 { global: old_libc_marker; local: *; };\n").unwrap();
            let st = std::process::Command::new("cc")
                .args(["-shared", "-fPIC", "-nostdlib", "-Wl,-soname,libc.so.6"])
                .arg(format!("-Wl,--version-script={}", map.display()))
                .arg("-o").arg(at).arg(&src)
                .status().expect("cc (the test builds a stand-in libc)");
            assert!(st.success());
        });
        let err = check_rootfs(tmp.path(), &exe).unwrap_err();
        let CheckError::TooOld { lib, missing, .. } = &err else { panic!("{err}") };
        assert_eq!(lib, "libc.so.6");
        assert!(!missing.is_empty() && !missing.contains("GLIBC_2.2.5"), "{err}");
    }

    #[test]
    fn the_rootfs_comes_from_the_bundle() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("config.json"), r#"{"root":{"path":"rootfs"}}"#).unwrap();
        let state = serde_json::json!({"ociVersion": "1.0.2", "id": "x", "status": "creating", "bundle": tmp.path()}).to_string();
        assert_eq!(rootfs_of_state(&state).unwrap(), tmp.path().join("rootfs"));
        std::fs::write(tmp.path().join("config.json"), r#"{"root":{"path":"/abs/root"}}"#).unwrap();
        assert_eq!(rootfs_of_state(&state).unwrap(), Path::new("/abs/root"));
        assert!(matches!(rootfs_of_state("{}"), Err(CheckError::State(_))));
    }
}
