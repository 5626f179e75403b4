//! The check a slice's CDI spec runs as a `createContainer` hook
//! (`egpu-cdi-hook`): after the container's mounts, before its first
//! process. Will every dynamically linked program of the container load
//! `libegpu.so`? The loader fails open when it cannot even find the preloaded
//! object (the preload list or the hook not mounted where expected, e.g.
//! shadowed by a volume: "cannot be preloaded … ignored") or never reads the
//! preload list (an image without glibc: musl). It fails closed, with a
//! cryptic error in every program, when a library the hook needs is missing
//! or too old. The check refuses the container in all these cases, with the
//! reason, before anything runs:
//!
//! - `/etc/ld.so.preload` in the container names exactly the hook, and the
//!   hook in the container is the host's file (same device and inode);
//! - every library the hook needs (`DT_NEEDED`) is in the image's library
//!   directories, and defines every symbol version the hook wants from it
//!   (the hook's `DT_VERNEED` against the library's `DT_VERDEF`, e.g.
//!   `libc.so.6` `GLIBC_2.34`).
//!
//! Paths are resolved inside the container's root (`openat2` with
//! `RESOLVE_IN_ROOT`), so the image's absolute symlinks stay in the image;
//! only regular files of at most [`MAX_FILE`] bytes are read.

use egpu_abi::paths::CONTAINER_HOOK;
use std::collections::BTreeSet;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The largest file the check reads.
pub const MAX_FILE: u64 = 256 << 20;

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a regular file of at most {MAX_FILE} bytes")]
    NotAFile { path: PathBuf },
    #[error("{path} is not an ELF shared library this check can read: {why}")]
    Elf { path: PathBuf, why: String },
    #[error("the OCI state on stdin is not valid: {0}")]
    State(String),
    #[error(
        "{what} in the container is not the slice's ({found}): the loader would run every program without the hook, unlimited. Is a volume or another device mounted over /etc or /run/egpu?"
    )]
    NotInPlace { what: String, found: String },
    #[error(
        "the image has no {lib} in {dirs}, and libegpu.so needs it: no program of this container could load the hook (an image without glibc, such as a musl one, never reads the preload list and would run unlimited)"
    )]
    Missing { lib: String, dirs: String },
    #[error(
        "the image's {lib} ({path}) lacks {missing}, which libegpu.so needs (it needs {needed}): every program of this container would fail to start. Use an image with a newer C library, or give egpud (--hook-lib) the hook built for glibc 2.17 by scripts/build-compat.sh"
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

/// What the shared object `data` (read from `path`) needs: every
/// `DT_NEEDED` library, with the versions its `DT_VERNEED` wants from it.
pub fn needs(path: &Path, data: &[u8]) -> Result<Vec<Need>, CheckError> {
    let (endian, sections) = sections(path, data)?;
    let mut out: Vec<Need> = Vec::new();
    let mut add = |lib: &[u8], versions: BTreeSet<String>| {
        let lib = String::from_utf8_lossy(lib).into_owned();
        match out.iter_mut().find(|n| n.lib == lib) {
            Some(n) => n.versions.extend(versions),
            None => out.push(Need { lib, versions }),
        }
    };
    if let Some((dynamic, link)) = sections.dynamic(endian, data).map_err(|e| elf_err(path, e))? {
        let strings = sections.strings(endian, data, link).map_err(|e| elf_err(path, e))?;
        for d in dynamic.iter().filter(|d| d.d_tag.get(endian) == object::elf::DT_NEEDED) {
            let name = strings.get(d.d_val.get(endian) as u32).map_err(|_| elf_err(path, "bad DT_NEEDED name"))?;
            add(name, BTreeSet::new());
        }
    }
    let Some((mut it, link)) = sections.gnu_verneed(endian, data).map_err(|e| elf_err(path, e))? else { return Ok(out) };
    let strings = sections.strings(endian, data, link).map_err(|e| elf_err(path, e))?;
    while let Some((need, mut aux)) = it.next().map_err(|e| elf_err(path, e))? {
        let lib = need.file(endian, strings).map_err(|e| elf_err(path, e))?;
        let mut versions = BTreeSet::new();
        while let Some(a) = aux.next().map_err(|e| elf_err(path, e))? {
            if a.vna_flags.get(endian) & object::elf::VER_FLG_WEAK == 0 {
                versions.insert(String::from_utf8_lossy(a.name(endian, strings).map_err(|e| elf_err(path, e))?).into_owned());
            }
        }
        add(lib, versions);
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

/// A file read from the container: its bytes, device and inode.
struct Found {
    data: Vec<u8>,
    dev: u64,
    ino: u64,
}

/// Reads `rel` (relative to the container root) with every symlink resolved
/// inside `root`; `Ok(None)` when there is no such file. Only a regular file
/// of at most [`MAX_FILE`] bytes is read: the type is checked on an
/// `O_PATH` descriptor (which opens nothing: no device's open side effects,
/// no FIFO to block on), and the file then opened for reading must be the
/// same one.
fn read_in_root(root: &std::fs::File, root_path: &Path, rel: &str) -> Result<Option<Found>, CheckError> {
    in_root(root, root_path, rel, true)
}

/// [`read_in_root`] without reading: the file's device and inode (`data` empty).
fn stat_in_root(root: &std::fs::File, root_path: &Path, rel: &str) -> Result<Option<Found>, CheckError> {
    in_root(root, root_path, rel, false)
}

fn in_root(root: &std::fs::File, root_path: &Path, rel: &str, read: bool) -> Result<Option<Found>, CheckError> {
    use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
    let shown = root_path.join(rel);
    let read_err = |source: std::io::Error| CheckError::Read { path: shown.clone(), source };
    let open = |flags: OFlags| rustix::fs::openat2(root, rel, flags | OFlags::CLOEXEC, Mode::empty(), ResolveFlags::IN_ROOT);
    let (dev, ino, file) = match open(OFlags::PATH) {
        Ok(pfd) => {
            let st = rustix::fs::fstat(&pfd).map_err(|e| read_err(e.into()))?;
            if !FileType::from_raw_mode(st.st_mode).is_file() || st.st_size as u64 > MAX_FILE {
                return Err(CheckError::NotAFile { path: shown });
            }
            if !read {
                return Ok(Some(Found { data: Vec::new(), dev: st.st_dev, ino: st.st_ino }));
            }
            let fd = open(OFlags::RDONLY | OFlags::NOCTTY | OFlags::NONBLOCK).map_err(|e| read_err(e.into()))?;
            (st.st_dev, st.st_ino, std::fs::File::from(fd))
        }
        // What the loader could not open either (a loop of links counts).
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => return Ok(None),
        // Kernels before 5.6: plain calls (an image's absolute symlink may then point out of it).
        Err(rustix::io::Errno::NOSYS) => match std::fs::metadata(&shown) {
            Ok(m) if !m.is_file() || m.len() > MAX_FILE => return Err(CheckError::NotAFile { path: shown }),
            Ok(m) if !read => return Ok(Some(Found { data: Vec::new(), dev: m.dev(), ino: m.ino() })),
            Ok(m) => (m.dev(), m.ino(), std::fs::OpenOptions::new().read(true).custom_flags(libc_nonblock()).open(&shown).map_err(read_err)?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(read_err(e)),
        },
        Err(e) => return Err(read_err(e.into())),
    };
    let meta = file.metadata().map_err(read_err)?;
    if (meta.dev(), meta.ino()) != (dev, ino) || !meta.is_file() {
        return Err(CheckError::NotAFile { path: shown });
    }
    let mut data = Vec::new();
    file.take(MAX_FILE).read_to_end(&mut data).map_err(read_err)?;
    Ok(Some(Found { data, dev, ino }))
}

/// `O_NONBLOCK` for the fallback open.
fn libc_nonblock() -> i32 {
    rustix::fs::OFlags::NONBLOCK.bits() as i32
}

/// Checks that every program of the container rooted at `rootfs` loads the
/// hook `hook_lib` (its host path) through `/etc/ld.so.preload`.
pub fn check_rootfs(rootfs: &Path, hook_lib: &Path) -> Result<(), CheckError> {
    let hook = std::fs::read(hook_lib).map_err(|source| CheckError::Read { path: hook_lib.into(), source })?;
    let hook_meta = std::fs::metadata(hook_lib).map_err(|source| CheckError::Read { path: hook_lib.into(), source })?;
    let root = std::fs::File::open(rootfs).map_err(|source| CheckError::Read { path: rootfs.into(), source })?;
    let preload = read_in_root(&root, rootfs, "etc/ld.so.preload")?;
    let listed = preload.as_ref().map(|f| String::from_utf8_lossy(&f.data).split_whitespace().collect::<Vec<_>>().join(" "));
    if listed.as_deref() != Some(CONTAINER_HOOK) {
        let found = listed.map_or("no such file".into(), |l| format!("it lists '{l}'"));
        return Err(CheckError::NotInPlace { what: "/etc/ld.so.preload".into(), found });
    }
    match stat_in_root(&root, rootfs, CONTAINER_HOOK.trim_start_matches('/'))? {
        Some(f) if (f.dev, f.ino) == (hook_meta.dev(), hook_meta.ino()) => {}
        Some(_) => return Err(CheckError::NotInPlace { what: CONTAINER_HOOK.into(), found: format!("another file than {}", hook_lib.display()) }),
        None => return Err(CheckError::NotInPlace { what: CONTAINER_HOOK.into(), found: "no such file".into() }),
    }
    let dirs = lib_dirs();
    for need in needs(hook_lib, &hook)? {
        let mut found = None;
        for d in &dirs {
            let rel = format!("{d}/{}", need.lib);
            if let Some(f) = read_in_root(&root, rootfs, &rel)? {
                found = Some((rel, f.data));
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
        let (rel, data) = lib_dirs().iter().find_map(|d| read_in_root(&f, root, &format!("{d}/libc.so.6")).unwrap().map(|x| (d.clone(), x.data))).unwrap();
        let have = defines(&root.join(rel), &data).unwrap();
        assert!(libc.versions.is_subset(&have), "{libc:?} vs {have:?}");
        assert!(matches!(needs(&exe, b"not an elf"), Err(CheckError::Elf { .. })));
    }

    /// The host's copy of `lib`.
    fn host_lib(lib: &str) -> PathBuf {
        lib_dirs().into_iter().map(|d| Path::new("/").join(d).join(lib)).find(|p| p.exists()).unwrap_or_else(|| panic!("no host {lib}"))
    }

    /// A container root whose "hook" is a copy of the test binary at
    /// /run/egpu/libegpu.so, named by /etc/ld.so.preload, holding for every
    /// library the binary needs what `put` makes of the host's copy; and the
    /// hook's path (the same file, as a bind mount would show it).
    fn image(put: impl Fn(&str, &Path, &Path)) -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(format!("lib/{}-linux-gnu", std::env::consts::ARCH));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(tmp.path().join("etc")).unwrap();
        std::fs::create_dir_all(tmp.path().join("run/egpu")).unwrap();
        let hook = tmp.path().join("run/egpu/libegpu.so");
        std::fs::copy(std::env::current_exe().unwrap(), &hook).unwrap();
        std::fs::write(tmp.path().join("etc/ld.so.preload"), format!("{}\n", CONTAINER_HOOK)).unwrap();
        for n in needs(&hook, &std::fs::read(&hook).unwrap()).unwrap() {
            put(&n.lib, &host_lib(&n.lib), &dir.join(&n.lib));
        }
        (tmp, hook)
    }

    #[test]
    fn an_image_with_the_libraries_passes_and_symlinks_stay_inside_it() {
        let (copies, exe) = image(|_, host, at| {
            std::fs::copy(host, at).unwrap();
        });
        check_rootfs(copies.path(), &exe).unwrap();
        // The preload list or the hook not in place (a volume over /etc, a
        // missing mount) would make the loader skip the hook.
        let preload = copies.path().join("etc/ld.so.preload");
        std::fs::write(&preload, "/usr/lib/other.so\n").unwrap();
        let err = check_rootfs(copies.path(), &exe).unwrap_err();
        assert!(matches!(&err, CheckError::NotInPlace { what, .. } if what == "/etc/ld.so.preload") && err.to_string().contains("/usr/lib/other.so"), "{err}");
        std::fs::remove_file(&preload).unwrap();
        assert!(matches!(check_rootfs(copies.path(), &exe), Err(CheckError::NotInPlace { .. })));
        std::fs::write(&preload, format!("{}\n", CONTAINER_HOOK)).unwrap();
        let other = copies.path().join("other-hook.so");
        std::fs::copy(&exe, &other).unwrap();
        let err = check_rootfs(copies.path(), &other).unwrap_err();
        assert!(err.to_string().contains("another file than"), "{err}");
        // A FIFO where a library should be is refused, not opened.
        let libc = copies.path().join(format!("lib/{}-linux-gnu/libc.so.6", std::env::consts::ARCH));
        std::fs::remove_file(&libc).unwrap();
        assert!(std::process::Command::new("mkfifo").arg(&libc).status().unwrap().success());
        assert!(matches!(check_rootfs(copies.path(), &exe), Err(CheckError::NotAFile { .. })));
        // Absolute links to the host's libraries point, inside the image, at
        // nothing: the image has no C library.
        let (links, exe) = image(|_, host, at| std::os::unix::fs::symlink(std::fs::canonicalize(host).unwrap(), at).unwrap());
        let err = check_rootfs(links.path(), &exe).unwrap_err();
        assert!(matches!(&err, CheckError::Missing { .. }) && err.to_string().contains("an image without glibc"), "{err}");
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
