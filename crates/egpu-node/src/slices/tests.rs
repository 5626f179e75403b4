use super::*;
use crate::devices::FakeGpus;
use egpu_abi::LimitsReader;

fn share(device: u32, gib: u64) -> DeviceShare {
    DeviceShare { device, memory: Bytes::gib(gib), memory_burst: Bytes(0), compute_share: Percent::ZERO, compute_limit: Percent::FULL }
}

fn req(name: &str, shares: Vec<DeviceShare>) -> CreateRequest {
    CreateRequest { spec: SliceSpec { name: name.into(), priority: Priority::Normal, devices: shares }, ephemeral: false, owner_pid: None }
}

fn manager(run: &Path, state: &Path) -> (SliceManager, AdoptReport) {
    let store = Store::open(state).unwrap();
    SliceManager::adopt(run, FakeGpus::new(2, 16 * Bytes::GIB).devices, store).unwrap()
}

#[test]
fn create_resize_delete_publish_to_the_slice_table() {
    let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut m, _) = manager(run.path(), state.path());
    let s = m.create(req("a", vec![share(0, 4), share(1, 2)])).unwrap();
    let lim = LimitsReader::open(&paths::limits_path(&s.dir)).unwrap();
    assert_eq!(lim.snapshot().devices()[1].mem_limit, 2 * Bytes::GIB);
    assert_eq!(lim.region().device_uuid(1), "GPU-fake-1");

    assert!(matches!(m.create(req("a", vec![share(0, 1)])), Err(SliceOpError::Exists(_))));
    let e = m.create(req("b", vec![share(0, 13)])).err().unwrap();
    assert!(e.to_string().contains("only 12GiB of 16GiB is free"), "{e}");

    let before = lim.seq();
    m.resize("a", ResizeRequest { devices: vec![1], memory: Some(Bytes::gib(14)), ..Default::default() }).unwrap();
    assert!(lim.seq() > before);
    assert_eq!(lim.snapshot().devices()[1].mem_limit, 14 * Bytes::GIB);
    assert_eq!(lim.snapshot().devices()[0].mem_limit, 4 * Bytes::GIB, "only device 1 changed");
    let e = m.resize("a", ResizeRequest { memory: Some(Bytes::gib(17)), ..Default::default() }).err().unwrap();
    assert!(matches!(e, SliceOpError::Capacity(CapacityError::AboveDevice { .. })), "{e}");
    assert!(matches!(m.resize("a", ResizeRequest { devices: vec![3], ..Default::default() }), Err(SliceOpError::BadRequest(_))));
    assert!(matches!(m.resize("nope", ResizeRequest::default()), Err(SliceOpError::NotFound(_))));
    // Compute shares add up to at most 100% per device.
    m.resize("a", ResizeRequest { compute_share: Some(Percent::from_pct(70)), ..Default::default() }).unwrap();
    let mut b = req("b", vec![share(0, 1)]);
    b.spec.devices[0].compute_share = Percent::from_pct(40);
    assert!(m.create(b).err().unwrap().to_string().contains("only 30% is unreserved"));

    let id = m.get("a").unwrap().record.id.clone();
    assert_eq!(m.get(&id).unwrap().name(), "a");
    let dir = m.get("a").unwrap().dir.clone();
    assert_eq!(m.delete(&id, false).unwrap(), Vec::<u32>::new());
    assert!(!dir.exists());
    assert!(lim.snapshot().state == egpu_abi::SliceState::Deleted);
    assert!(matches!(m.get("a"), Err(SliceOpError::NotFound(_))));
}

#[test]
fn a_slice_follows_its_gpu_when_the_gpus_are_renumbered() {
    let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    {
        let (mut m, _) = manager(run.path(), state.path());
        m.create(req("on-1", vec![share(1, 12)])).unwrap();
        m.create(req("on-0", vec![share(0, 4)])).unwrap();
    }
    // After a reboot GPU-fake-0 is gone, GPU-fake-1 is index 0, and a new GPU is index 1.
    let gpu = |index: u32, uuid: &str| crate::devices::DeviceInfo { index, uuid: uuid.into(), name: "Fake GPU".into(), memory_bytes: 16 * Bytes::GIB, sm_count: 108, nvlink_group: None, ..Default::default() };
    let adopt = || SliceManager::adopt(run.path(), vec![gpu(0, "GPU-fake-1"), gpu(1, "GPU-fake-new")], Store::open(state.path()).unwrap()).unwrap();
    let (mut m, report) = adopt();
    assert_eq!(report.moved_devices, vec![("on-1".to_string(), 1, 0)]);
    assert_eq!(report.missing_devices, vec![("on-0".to_string(), 0, "GPU-fake-0".to_string())]);
    assert_eq!(m.get("on-1").unwrap().record.spec.devices[0].device, 0);
    assert_eq!(m.get("on-0").unwrap().record.spec.devices[0].device, 2, "past the node's GPUs");
    // The limits file (kept: /run survived) says the new index too: the arbiter groups by it.
    let lim = LimitsReader::open(&paths::limits_path(&m.get("on-1").unwrap().dir)).unwrap();
    let d = lim.snapshot().devices()[0];
    assert_eq!((lim.region().device_uuid(0), d.mem_limit, d.host_index), ("GPU-fake-1".to_string(), 12 * Bytes::GIB, 0));
    // GPU-fake-1 holds its 12 GiB: nothing is promised twice. The missing
    // GPU's 4 GiB are counted nowhere. The new GPU is free.
    assert!(m.create(req("x", vec![share(0, 5)])).is_err());
    m.create(req("x", vec![share(0, 4)])).unwrap();
    m.create(req("y", vec![share(1, 16)])).unwrap();
    // Growing the slice whose GPU is gone is refused, saying so (shrinking it
    // commits nothing, and is allowed as for any slice).
    let e = m.resize("on-0", ResizeRequest { memory: Some(Bytes::gib(8)), ..Default::default() }).err().unwrap();
    assert!(matches!(e, SliceOpError::Capacity(CapacityError::NoSuchDevice { device: 2, .. })), "{e}");
    drop(m);
    // The store was rewritten: the next restart moves nothing.
    let (_, report) = adopt();
    assert!(report.moved_devices.is_empty(), "{report:?}");
}

#[test]
fn restart_adopts_and_repairs_files() {
    let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    {
        let (mut m, _) = manager(run.path(), state.path());
        m.create(req("keep", vec![share(0, 3)])).unwrap();
        m.create(req("wrongver", vec![share(1, 5)])).unwrap();
        m.create(req("gone", vec![share(1, 1)])).unwrap();
        m.resize("keep", ResizeRequest { memory: Some(Bytes::gib(6)), ..Default::default() }).unwrap();
    }
    // A slice table of another ABI version, and a deleted one.
    let lp = paths::limits_path(&paths::slice_dir(run.path(), "wrongver"));
    let mut bytes = std::fs::read(&lp).unwrap();
    bytes[8..12].copy_from_slice(&99u32.to_le_bytes());
    std::fs::write(&lp, bytes).unwrap();
    std::fs::remove_dir_all(paths::slice_dir(run.path(), "gone")).unwrap();

    let (m, report) = manager(run.path(), state.path());
    assert_eq!(report.adopted, vec!["gone", "keep", "wrongver"]);
    assert_eq!(report.recreated.len(), 3, "{report:?}");
    assert!(report.recreated.iter().any(|(p, why)| p == &lp && why.contains("ABI version 99")), "{report:?}");
    for (name, gib) in [("keep", 6), ("wrongver", 5), ("gone", 1)] {
        let lim = LimitsReader::open(&paths::limits_path(&m.get(name).unwrap().dir)).unwrap();
        assert_eq!(lim.snapshot().devices()[0].mem_limit, gib * Bytes::GIB, "{name}");
    }
}

#[test]
fn orphaned_ephemeral_slices_are_collected() {
    let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut m, _) = manager(run.path(), state.path());
    let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let mut r = req("eph", vec![share(0, 1)]);
    r.ephemeral = true;
    r.owner_pid = Some(child.id());
    m.create(r).unwrap();
    let mut mine = req("mine", vec![share(0, 1)]);
    mine.ephemeral = true;
    mine.owner_pid = Some(std::process::id());
    m.create(mine).unwrap();
    assert!(m.collect_orphans().is_empty());
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(m.collect_orphans(), vec!["eph"]);
    assert!(m.get("mine").is_ok());
}

#[test]
fn an_ephemeral_slice_without_an_owner_is_refused() {
    let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut m, _) = manager(run.path(), state.path());
    let mut r = req("eph", vec![share(0, 1)]);
    r.ephemeral = true;
    let Err(SliceOpError::BadRequest(msg)) = m.create(r) else { panic!("an ephemeral slice nothing could end was accepted") };
    assert!(msg.contains("owner_pid"), "{msg}");
    assert!(m.get("eph").is_err() && m.store.load_all().unwrap().is_empty(), "nothing is left of the refused request");
}

#[test]
fn ephemeral_slice_survives_its_owner_while_the_reported_workload_lives() {
    let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut m, _) = manager(run.path(), state.path());
    let mut owner = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let mut workload = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let mut r = req("eph", vec![share(0, 1)]);
    r.ephemeral = true;
    r.owner_pid = Some(owner.id());
    m.create(r).unwrap();
    m.set_workload("eph", workload.id()).unwrap();
    assert!(matches!(m.set_workload("eph", u32::MAX - 1), Err(SliceOpError::BadRequest(_))));
    owner.kill().unwrap();
    owner.wait().unwrap();
    // The workload has no usage record (it never made an intercepted call), yet it keeps the slice.
    assert!(m.get("eph").unwrap().live_pids().is_empty());
    assert!(m.collect_orphans().is_empty());
    drop(m);
    // The registration is persisted: a restarted agent keeps the slice too.
    let (mut m, _) = manager(run.path(), state.path());
    assert!(m.collect_orphans().is_empty());
    assert_eq!(m.get("eph").unwrap().record.workload.as_ref().map(|w| w.pid), Some(workload.id()));
    workload.kill().unwrap();
    workload.wait().unwrap();
    assert_eq!(m.collect_orphans(), vec!["eph"]);
}

#[test]
fn adoption_removes_slice_directories_the_store_does_not_know() {
    let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    {
        let (mut m, _) = manager(run.path(), state.path());
        m.create(req("kept", vec![share(0, 1)])).unwrap();
        m.create(req("half-deleted", vec![share(0, 1)])).unwrap();
    }
    let dir = paths::slice_dir(run.path(), "half-deleted");
    // A delete marks the limits deleted, then removes the store entry; a
    // crash before the directory went leaves this.
    egpu_abi::LimitsWriter::open(&paths::limits_path(&dir)).unwrap().mark_deleted();
    Store::open(state.path()).unwrap().remove("half-deleted").unwrap();
    let (m, report) = manager(run.path(), state.path());
    assert_eq!(report.adopted, vec!["kept"]);
    assert_eq!(report.orphan_dirs, vec![dir.clone()]);
    assert!(!dir.exists());
    assert!(m.get("kept").unwrap().dir.exists());
}

#[test]
fn a_live_slice_directory_the_store_does_not_know_fails_adoption_and_is_left_alone() {
    let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    {
        let (mut m, _) = manager(run.path(), state.path());
        m.create(req("lost", vec![share(0, 1)])).unwrap();
    }
    let dir = paths::slice_dir(run.path(), "lost");
    let lim = LimitsReader::open(&paths::limits_path(&dir)).unwrap();
    Store::open(state.path()).unwrap().remove("lost").unwrap();
    let e = SliceManager::adopt(run.path(), FakeGpus::new(1, 16 << 30).devices, Store::open(state.path()).unwrap()).err().expect("adoption fails");
    assert!(matches!(&e, SliceOpError::NotStored { names, .. } if names == &["lost"]), "{e}");
    assert_eq!(lim.snapshot().state, egpu_abi::SliceState::Active, "nothing changed");
    assert!(dir.exists());
    // Asked to drop it, adoption treats it as an interrupted delete's.
    let (_m, report) = SliceManager::adopt_with(run.path(), FakeGpus::new(1, 16 << 30).devices, Store::open(state.path()).unwrap(), Unstored::Drop).unwrap();
    assert_eq!(report.orphan_dirs, vec![dir.clone()]);
    assert_eq!(lim.snapshot().state, egpu_abi::SliceState::Deleted);
    assert!(!dir.exists());
}

/// Another process holding a record lock (the first record's) on the usage
/// file `usage`, whatever its layout, until its stdin closes.
fn lock_holder(usage: &Path) -> std::process::Child {
    use std::io::BufRead;
    let mut holder = std::process::Command::new("python3")
        .args(["-c", "import fcntl,sys; f=open(sys.argv[1],'r+b'); fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 4096); print('locked', flush=True); sys.stdin.read()"])
        .arg(usage)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    std::io::BufReader::new(holder.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "locked");
    holder
}

#[test]
fn an_unstored_directory_whose_limits_cannot_be_read_is_live_while_a_process_is_attached() {
    use std::io::Write;
    let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    {
        let (mut m, _) = manager(run.path(), state.path());
        m.create(req("unreadable", vec![share(0, 1)])).unwrap();
    }
    let dir = paths::slice_dir(run.path(), "unreadable");
    Store::open(state.path()).unwrap().remove("unreadable").unwrap();
    // Limits of another ABI version: this build cannot tell whether they are live.
    let mut f = std::fs::OpenOptions::new().write(true).open(paths::limits_path(&dir)).unwrap();
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(8)).unwrap();
    f.write_all(&99u32.to_ne_bytes()).unwrap();
    drop(f);
    assert!(LimitsReader::open(&paths::limits_path(&dir)).is_err());
    // A process attached to its usage file: live, so adoption is refused.
    let mut holder = lock_holder(&paths::usage_path(&dir));
    let e = SliceManager::adopt(run.path(), FakeGpus::new(2, 16 * Bytes::GIB).devices, Store::open(state.path()).unwrap()).err().expect("refused while attached");
    assert!(matches!(&e, SliceOpError::NotStored { names, .. } if names == &["unreadable"]), "{e}");
    // Nothing attached: what an interrupted create or delete leaves; it goes.
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    let (_m, report) = manager(run.path(), state.path());
    assert_eq!(report.orphan_dirs, vec![dir.clone()]);
    assert!(!dir.exists());
}

#[test]
fn an_orphan_directory_whose_usage_file_this_build_cannot_read_waits_for_the_processes_locked_in_it() {
    use std::io::Write;
    let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    {
        let (mut m, _) = manager(run.path(), state.path());
        m.create(req("other-abi", vec![share(0, 1)])).unwrap();
    }
    let dir = paths::slice_dir(run.path(), "other-abi");
    let usage = paths::usage_path(&dir);
    // The usage file of another ABI version (its version word changed)...
    let mut f = std::fs::OpenOptions::new().write(true).open(&usage).unwrap();
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(std::mem::offset_of!(egpu_abi::UsageRegion, abi_version) as u64)).unwrap();
    f.write_all(&99u32.to_ne_bytes()).unwrap();
    drop(f);
    assert!(UsageFile::open(&usage).is_err(), "this build must not read it");
    // ... with a process of that version attached: it holds a record lock.
    let mut holder = lock_holder(&usage);
    // An interrupted delete: limits marked deleted, store entry gone.
    egpu_abi::LimitsWriter::open(&paths::limits_path(&dir)).unwrap().mark_deleted();
    Store::open(state.path()).unwrap().remove("other-abi").unwrap();
    let (mut m, report) = manager(run.path(), state.path());
    assert_eq!(report.orphan_dirs, vec![dir.clone()]);
    assert!(dir.exists(), "removed while a process was attached to it");
    m.sweep();
    assert!(dir.exists(), "removed by the sweep while a process was attached to it");
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    m.sweep();
    assert!(!dir.exists(), "kept after its last process exited");
}

#[test]
fn a_slice_whose_cdi_spec_cannot_be_written_is_not_created() {
    let (run, state, cdi) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut m, _) = manager(run.path(), state.path());
    let cfg = crate::NodeConfig {
        run_dir: run.path().into(),
        state_dir: state.path().into(),
        socket: None,
        simulate: None,
        hook_lib: "/t/libegpu.so".into(),
        sim_lib: "/t/libegpu_simgpu.so".into(),
        sweep_period_ms: 200,
        cdi_dir: Some(cdi.path().into()),
        cdi_hook: "/t/egpu-cdi-hook".into(),
        memory_audit: Default::default(),
        memory_audit_slack: crate::audit::DEFAULT_SLACK,
        drop_unstored_slices: false,
        adopt_unstored_slices: false,
        sysfs: None,
    };
    m.set_cdi(crate::cdi::CdiPublisher::new(&cfg, cdi.path()).unwrap());
    m.create(req("ok", vec![share(0, 1)])).unwrap();
    assert!(cdi.path().join("egpu.io-slice_ok.json").is_file());
    // A directory where the spec should go: the rename into place fails.
    std::fs::create_dir(cdi.path().join("egpu.io-slice_blocked.json")).unwrap();
    let e = m.create(req("blocked", vec![share(0, 1)])).err().unwrap();
    assert!(matches!(e, SliceOpError::Cdi(_)), "{e}");
    assert!(m.get("blocked").is_err() && !paths::slice_dir(run.path(), "blocked").exists(), "the slice was rolled back");
    assert!(m.store.load_all().unwrap().iter().all(|r| r.spec.name != "blocked"), "the stored slice was rolled back");
    m.create(req("after", vec![share(0, 1)])).unwrap();
    assert!(cdi.path().join("egpu.io-slice_after.json").is_file());
    // Another slice's spec failing (removed, and a directory in its way)
    // does not refuse new slices.
    std::fs::remove_file(cdi.path().join("egpu.io-slice_ok.json")).unwrap();
    std::fs::create_dir(cdi.path().join("egpu.io-slice_ok.json")).unwrap();
    m.create(req("more", vec![share(0, 1)])).unwrap();
    assert!(cdi.path().join("egpu.io-slice_more.json").is_file());
}

#[test]
fn a_slice_whose_files_cannot_be_opened_stays_reserved_and_is_adopted_once_they_can() {
    let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    {
        let (mut m, _) = manager(run.path(), state.path());
        m.create(req("a", vec![share(0, 2)])).unwrap();
        let mut b = req("b", vec![share(0, 3)]);
        b.spec.devices[0].memory_burst = Bytes::gib(5);
        m.create(b).unwrap();
    }
    // An I/O error on one slice's files (a directory where its limits file
    // was: EISDIR, which no recreate cures; root is not stopped by EACCES).
    let limits = paths::limits_path(&paths::slice_dir(run.path(), "b"));
    std::fs::remove_file(&limits).unwrap();
    std::fs::create_dir(&limits).unwrap();
    let (mut m, report) = manager(run.path(), state.path());
    assert_eq!(report.adopted, vec!["a".to_string()], "the other slice is adopted");
    assert_eq!(report.failed.len(), 1);
    assert_eq!(report.failed[0].0, "b");
    assert!(report.failed[0].1.contains("limits"), "{:?}", report.failed);
    assert!(paths::slice_dir(run.path(), "b").exists(), "its directory is not taken for an orphan");
    let e = m.get("b").err().unwrap();
    assert!(matches!(e, SliceOpError::Unadopted { .. }), "{e}");
    assert!(e.to_string().contains("fix the cause"), "{e}");
    assert!(matches!(m.create(req("b", vec![share(0, 1)])), Err(SliceOpError::Unadopted { .. })));
    assert!(matches!(m.delete("b", true), Err(SliceOpError::Unadopted { .. })));
    // Its memory stays reserved, at its burst cap: 16 - 2 - 5 GiB are free,
    // and the burst pool counts its 2 GiB above the guarantee as lent.
    assert_eq!(m.allocated()[0].memory, 7 * Bytes::GIB);
    assert_eq!(crate::burst::lent(&m)[0], 2 * Bytes::GIB);
    let e = m.create(req("c", vec![share(0, 10)])).err().unwrap();
    assert!(e.to_string().contains("only 9GiB of 16GiB is free"), "{e}");
    m.resize("a", ResizeRequest { memory: Some(Bytes::gib(12)), ..Default::default() }).err().expect("a resize counts it too");
    assert_eq!(m.sweep(), 0);
    assert_eq!(m.unadopted().count(), 1, "still failing");

    // Cured: the next sweep adopts it.
    std::fs::remove_dir(&limits).unwrap();
    m.sweep();
    assert_eq!(m.unadopted().count(), 0);
    let b = m.get("b").unwrap();
    assert_eq!(b.record.spec.devices[0].memory, Bytes::gib(3));
    assert_eq!(LimitsReader::open(&limits).unwrap().snapshot().devices()[0].mem_limit, 3 * Bytes::GIB);
    assert_eq!(m.allocated()[0].memory, 5 * Bytes::GIB);
    assert_eq!(crate::burst::lent(&m)[0], 0, "adopted, it holds what its usage says");
}

#[test]
fn a_usage_file_with_records_held_is_not_recreated_under_its_processes() {
    use std::io::Write;
    let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    {
        let (mut m, _) = manager(run.path(), state.path());
        m.create(req("a", vec![share(0, 4)])).unwrap();
    }
    let usage = paths::usage_path(&paths::slice_dir(run.path(), "a"));
    // A process of the slice holds a record; its header is then overwritten
    // (by a process of the slice, or it is an older egpud's layout) while
    // egpud is down.
    let mut holder = lock_holder(&usage);
    let mut f = std::fs::OpenOptions::new().write(true).open(&usage).unwrap();
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(std::mem::offset_of!(egpu_abi::UsageRegion, abi_version) as u64)).unwrap();
    f.write_all(&7u32.to_ne_bytes()).unwrap();
    drop(f);
    let inode = || std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&usage).unwrap());
    let before = inode();
    // The restarted egpud keeps the file and the slice reserved at its cap,
    // and removes nothing under the process.
    let (mut m, report) = manager(run.path(), state.path());
    assert_eq!(inode(), before, "the usage file was recreated under a process holding a record in it");
    assert_eq!(report.failed.len(), 1, "{:?}", report.failed);
    assert!(report.failed[0].1.contains("still hold records") && report.failed[0].1.contains("of this ABI version"), "{:?}", report.failed);
    assert!(matches!(m.get("a"), Err(SliceOpError::Unadopted { .. })));
    assert!(matches!(m.delete("a", false), Err(SliceOpError::Unadopted { .. })));
    assert_eq!(m.allocated()[0].memory, 4 * Bytes::GIB);
    m.sweep();
    assert_eq!(m.unadopted().count(), 1, "adopted while the process holds its record");
    // Its last process gone, the next sweep recreates the file and adopts the slice.
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    m.sweep();
    assert_eq!(m.unadopted().count(), 0);
    assert_ne!(inode(), before);
    assert!(m.get("a").unwrap().live_pids().is_empty());
    m.delete("a", false).unwrap();
}

#[test]
fn a_slice_directory_that_cannot_be_removed_is_left_to_the_sweep() {
    let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut m, _) = manager(run.path(), state.path());
    // A directory not even root may remove (procfs), standing in for one
    // with an I/O error; the removal is tried again at every sweep.
    let stuck = Path::new("/proc/self/task");
    m.remove_slice_dir(stuck);
    m.remove_slice_dir(stuck);
    assert_eq!(m.orphan_dirs, vec![stuck.to_path_buf()], "kept once, for the sweep");
    m.sweep();
    assert_eq!(m.orphan_dirs, vec![stuck.to_path_buf()], "still there: still kept");
    // One that can be removed is simply removed.
    let dir = run.path().join("slices/gone");
    std::fs::create_dir_all(&dir).unwrap();
    m.remove_slice_dir(&dir);
    assert!(!dir.exists());
    assert_eq!(m.orphan_dirs.len(), 1);
}

#[test]
fn a_usage_file_given_up_by_the_guard_counts_at_its_cap_until_the_sweep_maps_it_anew() {
    egpu_abi::map::install_truncation_guard().unwrap();
    let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut m, _) = manager(run.path(), state.path());
    let mut b = req("cut", vec![share(0, 3)]);
    b.spec.devices[0].memory_burst = Bytes::gib(5);
    m.create(b).unwrap();
    let path = paths::usage_path(&m.get("cut").unwrap().dir);
    for _ in 0..=egpu_abi::map::MAX_REPAIRS {
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(0).unwrap();
        let _ = m.get("cut").unwrap().usage.used(0);
    }
    assert!(m.get("cut").unwrap().usage.detached());
    // Blind: taken to hold its burst cap, and not deleted without --force.
    assert_eq!(crate::burst::lent(&m)[0], 2 * Bytes::GIB);
    assert!(matches!(m.delete("cut", false), Err(SliceOpError::Unknown { .. })));
    // The sweep puts the file right and maps it anew.
    m.sweep();
    let s = m.get("cut").unwrap();
    assert!(!s.usage.detached());
    assert!(s.usage_repairs >= 1);
    assert!(UsageFile::open(&path).is_ok(), "the file is whole again");
    assert_eq!(crate::burst::lent(&m)[0], 0);
    m.delete("cut", false).unwrap();
}

#[test]
fn a_change_the_store_lost_comes_back_from_the_limits_file() {
    let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let store_file = state.path().join(crate::store::STORE_FILE);
    let before_resize = state.path().join("before-resize");
    {
        let (mut m, _) = manager(run.path(), state.path());
        m.create(req("a", vec![share(0, 4), share(1, 2)])).unwrap();
        m.create(req("b", vec![share(0, 1)])).unwrap();
        assert_eq!(m.get("a").unwrap().record.rev, 1);
    }
    // The store as it was before the resize: what redb falls back to when
    // the commit after it does not check.
    std::fs::copy(&store_file, &before_resize).unwrap();
    let resized = {
        let (mut m, _) = manager(run.path(), state.path());
        let r = ResizeRequest {
            devices: vec![1],
            memory: Some(Bytes::gib(6)),
            memory_burst: Some(Bytes::gib(9)),
            compute_share: Some(Percent::from_pct(30)),
            compute_limit: Some(Percent::from_pct(80)),
            priority: Some(Priority::High),
        };
        let s = m.resize("a", r).unwrap();
        assert_eq!(s.record.rev, 2);
        // A burst grant on top of the new guarantee, published with it.
        let s = m.slice_mut("a").unwrap();
        s.granted[1] = Bytes::GIB;
        s.publish().unwrap();
        m.get("a").unwrap().record.clone()
    };
    std::fs::copy(&before_resize, &store_file).unwrap();

    let (m, report) = manager(run.path(), state.path());
    assert_eq!(report.restored, vec![("a".to_string(), 1, 2)], "{report:?}");
    assert_eq!(m.recovered(), 1, "counted for the metric");
    let a = m.get("a").unwrap();
    assert_eq!(a.record.spec, resized.spec, "the resize the store lost is back");
    assert_eq!((a.record.rev, a.record.id.as_str()), (2, resized.id.as_str()));
    assert_eq!(a.granted, vec![0, Bytes::GIB], "the grant stays a grant, apart from the guarantee");
    let lim = LimitsReader::open(&paths::limits_path(&a.dir)).unwrap();
    assert_eq!(lim.snapshot().devices()[1].mem_limit, 7 * Bytes::GIB);
    assert_eq!(m.get("b").unwrap().record.spec.devices[0].memory, Bytes::gib(1), "a slice the loss did not touch stays as stored");
    drop(m);
    // The store has it again: the next start restores nothing.
    let (m, report) = manager(run.path(), state.path());
    assert!(report.restored.is_empty(), "{report:?}");
    assert_eq!(m.recovered(), 0);
    assert_eq!(m.get("a").unwrap().record.spec, resized.spec);
}

#[test]
fn a_limits_file_that_is_not_ahead_or_not_the_slices_leaves_the_store_as_it_is() {
    let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dir = {
        let (mut m, _) = manager(run.path(), state.path());
        m.create(req("a", vec![share(0, 4)])).unwrap();
        m.resize("a", ResizeRequest { memory: Some(Bytes::gib(5)), ..Default::default() }).unwrap();
        m.get("a").unwrap().dir.clone()
    };
    let w = LimitsWriter::open(&paths::limits_path(&dir)).unwrap();
    let devices = w.snapshot().devices().to_vec();
    let check = |rev: u64, guarantee: u64, tamper: &dyn Fn(&LimitsWriter)| {
        w.publish_spec(1, &devices, rev, &[guarantee]).unwrap();
        tamper(&w);
        let (m, report) = manager(run.path(), state.path());
        assert!(report.restored.is_empty(), "rev {rev}: {report:?}");
        assert_eq!(m.get("a").unwrap().record.spec.devices[0].memory, Bytes::gib(5), "rev {rev}");
    };
    // The store ahead of the file (a resize stored, then egpud killed before it published).
    check(1, 3 * Bytes::GIB, &|_| {});
    // Ahead, but a guarantee no slice can have.
    check(9, 0, &|_| {});
    // Ahead, but a writer died inside a publish: nothing reliable to read.
    check(9, 3 * Bytes::GIB, &|w| w.region().seq.store(w.region().seq.load(Ordering::Relaxed) | 1, Ordering::Release));
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config { cases: 64, ..Default::default() })]
    /// Whatever a limits file says at adoption, egpud neither panics nor
    /// takes back a spec it could not have admitted: it restores exactly
    /// the file's values when the file is ahead and they make a spec that
    /// fits the GPU, and otherwise keeps the stored spec.
    #[test]
    fn adoption_takes_back_only_an_admissible_spec_that_is_ahead(
        rev in 0u64..4,
        prio in 0u32..4,
        // Mostly values egpud could have written, so both branches are
        // reached often; sometimes anything at all.
        guarantee in proptest::prop_oneof![4 => 1u64..=16 << 30, 1 => 0u64..=20 << 30, 1 => proptest::prelude::any::<u64>()],
        burst in proptest::prop_oneof![2 => proptest::prelude::Just(0u64), 2 => 12u64 << 30..=16 << 30, 1 => 0u64..=20 << 30, 1 => proptest::prelude::any::<u64>()],
        cshare in 0u32..6_000,
        limit in proptest::prop_oneof![3 => 6_000u32..=10_000, 1 => 0u32..12_000],
    ) {
        let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let stored = {
            let (mut m, _) = manager(run.path(), state.path());
            m.create(req("p", vec![share(1, 4)])).unwrap().record.spec.clone()
        };
        let w = LimitsWriter::open(&paths::limits_path(&paths::slice_dir(run.path(), "p"))).unwrap();
        w.set_mem_burst(0, burst);
        let lim = DeviceLimitsSnapshot { host_index: 1, mem_limit: guarantee, compute_share_bps: cshare, compute_limit_bps: limit };
        w.publish_spec(prio, &[lim], rev, &[guarantee]).unwrap();
        drop(w);
        let (m, report) = manager(run.path(), state.path());
        let got = &m.get("p").unwrap().record;
        let gpu = 16 * Bytes::GIB;
        let admissible = rev > 1
            && prio <= 2
            && guarantee > 0
            && guarantee <= gpu
            && (burst == 0 || (burst >= guarantee && burst <= gpu))
            && limit > 0
            && limit >= cshare
            && limit <= 10_000;
        if admissible {
            proptest::prop_assert_eq!(&report.restored, &vec![("p".to_string(), 1, rev)]);
            let d = got.spec.devices[0];
            proptest::prop_assert_eq!((d.device, d.memory.0, d.memory_burst.0, d.compute_share.0, d.compute_limit.0), (1, guarantee, burst, cshare, limit));
            proptest::prop_assert_eq!(got.spec.priority.code(), prio);
            proptest::prop_assert_eq!(got.rev, rev);
        } else {
            proptest::prop_assert!(report.restored.is_empty(), "{:?}", report);
            proptest::prop_assert_eq!(&got.spec, &stored);
            proptest::prop_assert_eq!(got.rev, 1);
        }
    }
}

#[test]
fn a_record_from_before_spec_revisions_gets_one_so_its_slice_can_be_taken_back() {
    let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    {
        let (mut m, _) = manager(run.path(), state.path());
        m.create(req("a", vec![share(0, 4)])).unwrap();
    }
    // What a schema-2 store's record, migrated, is: revision 0, and the
    // limits file an egpud then publishes with it.
    let store = Store::open(state.path()).unwrap();
    let mut record = store.load_all().unwrap().pop().unwrap();
    record.rev = 0;
    store.put(&record).unwrap();
    drop(store);
    let lim = LimitsWriter::open(&paths::limits_path(&paths::slice_dir(run.path(), "a"))).unwrap();
    lim.publish_spec(1, lim.snapshot().devices(), 0, &[4 << 30]).unwrap();
    let (m, _) = manager(run.path(), state.path());
    assert_eq!(m.get("a").unwrap().record.rev, 1);
    assert_eq!(lim.region().published_spec().unwrap().rev, 1);
    drop(m);
    assert_eq!(Store::open(state.path()).unwrap().load_all().unwrap()[0].rev, 1, "stored");
    // The store lost: the slice comes back from its limits file.
    Store::open(state.path()).unwrap().remove("a").unwrap();
    let (m, report) = SliceManager::adopt_with(run.path(), FakeGpus::new(2, 16 * Bytes::GIB).devices, Store::open(state.path()).unwrap(), Unstored::Adopt).unwrap();
    assert_eq!(report.taken_back, vec!["a"]);
    assert_eq!(m.get("a").unwrap().record.spec, record.spec);
}

#[test]
fn live_slices_the_store_lost_are_taken_back_from_their_limits_files_all_or_nothing() {
    let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let gpus = || FakeGpus::new(2, 16 * Bytes::GIB).devices;
    let (kept, lost) = {
        let (mut m, _) = manager(run.path(), state.path());
        m.create(req("kept", vec![share(0, 8)])).unwrap();
        let mut r = req("lost", vec![share(0, 4), share(1, 2)]);
        r.spec.priority = Priority::BestEffort;
        r.spec.devices[1].memory_burst = Bytes::gib(6);
        r.spec.devices[1].compute_share = Percent::from_pct(25);
        m.create(r).unwrap();
        m.resize("lost", ResizeRequest { devices: vec![0], memory: Some(Bytes::gib(5)), ..Default::default() }).unwrap();
        m.create(req("old", vec![share(1, 1)])).unwrap();
        (m.get("kept").unwrap().record.clone(), m.get("lost").unwrap().record.clone())
    };
    let store = Store::open(state.path()).unwrap();
    store.remove("lost").unwrap();
    store.remove("old").unwrap();
    drop(store);
    // `old`'s table is one an egpud before spec revisions wrote.
    let old = LimitsWriter::open(&paths::limits_path(&paths::slice_dir(run.path(), "old"))).unwrap();
    old.publish_spec(1, old.snapshot().devices(), 0, &[0]).unwrap();
    let adopt = || SliceManager::adopt_with(run.path(), gpus(), Store::open(state.path()).unwrap(), Unstored::Adopt);
    let e = adopt().err().expect("one cannot be taken back: nothing is");
    let msg = e.to_string();
    assert!(matches!(&e, SliceOpError::CannotTakeBack { why } if why.len() == 1), "{msg}");
    assert!(msg.contains("old: its limits file does not publish a spec") && msg.contains("--drop-unstored-slices"), "{msg}");
    assert!(Store::open(state.path()).unwrap().load_all().unwrap().iter().all(|r| r.spec.name == "kept"), "nothing stored");
    // Without `old`, `lost` comes back as it was, with a new id, persistent.
    std::fs::remove_dir_all(paths::slice_dir(run.path(), "old")).unwrap();
    let (m, report) = adopt().unwrap();
    assert_eq!(report.taken_back, vec!["lost"]);
    assert_eq!(m.recovered(), 1);
    assert_eq!(report.adopted, vec!["kept", "lost"]);
    let got = &m.get("lost").unwrap().record;
    assert_eq!((&got.spec, &got.device_uuids, got.rev, got.ephemeral), (&lost.spec, &lost.device_uuids, 2, false));
    assert_ne!(got.id, lost.id);
    assert_eq!(m.get("kept").unwrap().record, kept);
    drop(m);
    // Stored now: a plain start adopts it.
    let (m, report) = manager(run.path(), state.path());
    assert!(report.taken_back.is_empty());
    assert_eq!(m.get("lost").unwrap().record.spec, lost.spec);
    drop(m);

    // No room beside the stored slices (another state directory's slices
    // would be counted twice): refused, and nothing changes.
    Store::open(state.path()).unwrap().remove("lost").unwrap();
    {
        let store = Store::open(state.path()).unwrap();
        let mut big = kept.clone();
        big.spec.name = "big".into();
        big.id = "s-000000000001".into();
        big.spec.devices[0].memory = Bytes::gib(8);
        store.put(&big).unwrap();
    }
    let msg = adopt().err().expect("no room").to_string();
    assert!(msg.contains("lost: ") && msg.contains("free"), "{msg}");
    assert!(!Store::open(state.path()).unwrap().load_all().unwrap().iter().any(|r| r.spec.name == "lost"));
}

#[test]
fn a_lost_slice_whose_table_has_a_compute_cap_above_100_percent_is_not_taken_back() {
    let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    {
        let (mut m, _) = manager(run.path(), state.path());
        m.create(req("odd", vec![share(0, 1)])).unwrap();
    }
    Store::open(state.path()).unwrap().remove("odd").unwrap();
    let w = LimitsWriter::open(&paths::limits_path(&paths::slice_dir(run.path(), "odd"))).unwrap();
    let mut d = w.snapshot().devices().to_vec();
    d[0].compute_limit_bps = 15_000;
    w.publish_spec(1, &d, 1, &[Bytes::GIB]).unwrap();
    let e = SliceManager::adopt_with(run.path(), FakeGpus::new(2, 16 * Bytes::GIB).devices, Store::open(state.path()).unwrap(), Unstored::Adopt).err().expect("refused");
    assert!(e.to_string().contains("odd: its limits file has a compute cap of 15000 basis points, above 100%"), "{e}");
    assert!(Store::open(state.path()).unwrap().load_all().unwrap().is_empty(), "nothing stored");
}
