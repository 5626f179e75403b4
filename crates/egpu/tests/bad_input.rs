//! Bad input gets clear errors and meaningful exit codes (2 usage, 3 not
//! found, 4 rejected, 5 unreachable), and bad state stops egpud clearly.

mod common;
use common::*;
use std::process::Stdio;

#[test]
fn malformed_quantities_are_usage_errors() {
    let node = Node::start("1x16GiB");
    let o = node.egpu(&["create", "--name", "x", "--gpu-memory", "12XB"]);
    assert_fails(&o, 2, &["unknown unit 'XB'"]);
    let o = node.egpu(&["create", "--name", "x", "--gpu-memory", "lots"]);
    assert_fails(&o, 2, &["is not a size"]);
    let o = node.egpu(&["create", "--name", "x", "--gpu-memory", "1GiB", "--gpu-compute", "150%"]);
    assert_fails(&o, 2, &["between 0% and 100%"]);
    let o = node.egpu(&["create", "--name", "x", "--gpu-memory", "1GiB", "--priority", "urgent"]);
    assert_fails(&o, 2, &["use high, normal or best-effort"]);
    let o = node.egpu(&["create", "--name", "x"]);
    assert_fails(&o, 2, &["--gpu-memory"]);
    let o = node.egpu(&["create", "--name", "Bad Name", "--gpu-memory", "1GiB"]);
    assert_fails(&o, 2, &["slice name 'Bad Name' is invalid"]);
    let o = node.egpu(&["create", "--name", "x", "--gpu-memory", "1GiB", "--gpu-compute", "60%", "--gpu-compute-limit", "50%"]);
    assert_fails(&o, 2, &["below the guaranteed share"]);
    let o = node.egpu(&["create", "--name", "x", "--gpu-memory", "0"]);
    assert_fails(&o, 2, &["must be greater than zero"]);
    node.ok(&["create", "--name", "x", "--gpu-memory", "1GiB"]);
    let o = node.egpu(&["resize", "x"]);
    assert_fails(&o, 2, &["nothing to change"]);
    assert_eq!(node.slices().len(), 1);
}

#[test]
fn overcommit_is_rejected_saying_what_is_free() {
    let node = Node::start("1x16GiB");
    let o = node.egpu(&["create", "--name", "big", "--gpu-memory", "17GiB"]);
    assert_fails(&o, 4, &["17GiB requested but the device has only 16GiB"]);
    node.ok(&["create", "--name", "a", "--gpu-memory", "10GiB", "--gpu-compute", "60%"]);
    let o = node.egpu(&["create", "--name", "b", "--gpu-memory", "7GiB"]);
    assert_fails(&o, 4, &["only 6GiB of 16GiB is free"]);
    let o = node.egpu(&["create", "--name", "b", "--gpu-memory", "1GiB", "--gpu-compute", "50%"]);
    assert_fails(&o, 4, &["only 40% is unreserved"]);
    node.ok(&["create", "--name", "b", "--gpu-memory", "6GiB", "--gpu-compute", "40%"]);
    let o = node.egpu(&["resize", "a", "--gpu-memory", "11GiB"]);
    assert_fails(&o, 4, &["only 10GiB of 16GiB is free"]);
    let o = node.egpu(&["create", "--name", "a", "--gpu-memory", "1MiB"]);
    assert_fails(&o, 4, &["already exists"]);
    // A resize below the current limit is always allowed (usage may exceed it; nothing is killed).
    node.ok(&["resize", "a", "--gpu-memory", "1MiB"]);
    assert_eq!(node.slice("a")["devices"][0]["memory_limit_bytes"], 1u64 << 20);
}

#[test]
fn unknown_slices_and_devices_are_not_found() {
    let node = Node::start("2x16GiB");
    for args in [
        &["resize", "nope", "--gpu-memory", "1GiB"][..],
        &["rm", "nope"],
        &["get", "nope"],
        &["exec", "nope", "--", "true"],
        &["env", "nope"],
    ] {
        let o = node.egpu(args);
        assert_fails(&o, 3, &["no slice named 'nope'"]);
    }
    let o = node.egpu(&["create", "--name", "x", "--gpu-memory", "1GiB", "--device", "5"]);
    assert_fails(&o, 3, &["device 5 does not exist", "this node has 2 device(s)"]);
    node.ok(&["create", "--name", "x", "--gpu-memory", "1GiB", "--device", "0"]);
    let o = node.egpu(&["resize", "x", "--gpu-memory", "2GiB", "--device", "1"]);
    assert_fails(&o, 2, &["has no device 1"]);
}

#[test]
fn unreachable_egpud_says_how_to_start_it() {
    let dir = tempfile::tempdir().unwrap();
    let o = std::process::Command::new(EGPU).env("EGPU_SOCKET", dir.path().join("none.sock")).args(["ls"]).output().unwrap();
    assert_fails(&o, 5, &["cannot reach egpud at", "none.sock", "egpud --simulate 2x16GiB"]);
}

#[test]
fn the_socket_flag_wins_over_egpu_socket_and_an_empty_egpu_socket_is_unset() {
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("flag.sock");
    for env in ["", "/nowhere/env.sock"] {
        for args in [&["--socket", flag.to_str().unwrap(), "ls"][..], &["ls", "--socket", flag.to_str().unwrap()][..]] {
            let o = std::process::Command::new(EGPU).env("EGPU_SOCKET", env).args(args).output().unwrap();
            assert_fails(&o, 5, &["cannot reach egpud at", "flag.sock"]);
        }
    }
    let o = std::process::Command::new(EGPU).env("EGPU_SOCKET", "").args(["ls"]).output().unwrap();
    assert_fails(&o, 5, &["cannot reach egpud at", egpu_cli::cli::DEFAULT_SOCKET]);
    let help = std::process::Command::new(EGPU).arg("--help").output().unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains(&format!("[env: EGPU_SOCKET; default: {}]", egpu_cli::cli::DEFAULT_SOCKET)));
}

#[test]
fn second_egpud_on_the_same_run_dir_is_refused() {
    let node = Node::start("1x16GiB");
    let o = node.daemon_cmd().stdout(Stdio::null()).output().unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&format!("another egpud (pid {}) already serves run directory", node.daemon_pid())), "{err}");
    // The first one still serves.
    node.ok(&["devices"]);
}

#[test]
fn corrupted_store_stops_egpud_and_names_the_file() {
    let mut node = Node::start("1x16GiB");
    node.ok(&["create", "--name", "keep", "--gpu-memory", "2GiB"]);
    node.kill9();
    let store = node.state_dir().join("egpud.redb");
    let len = std::fs::metadata(&store).unwrap().len() as usize;
    std::fs::write(&store, vec![0xa5u8; len.max(4096)]).unwrap();
    let o = node.daemon_cmd().stdout(Stdio::null()).output().unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&store.display().to_string()) && err.contains("move it aside") && err.contains("refuses to start"), "{err}");
    // Nothing was discarded: the slice's files are where they were.
    assert!(node.run_dir().join("slices/keep/limits").exists());
    assert!(err.contains("--adopt-unstored-slices"), "{err}");

    // As the message says: the store moved aside, egpud takes the live
    // slice back from its limits file.
    std::fs::rename(&store, store.with_extension("redb.broken")).unwrap();
    node.extra.push("--adopt-unstored-slices".into());
    node.restart();
    assert_eq!(node.slice("keep")["devices"][0]["memory_limit_bytes"], 2u64 << 30);
    node.kill9();
    node.extra.clear();

    // A store cut to 0 bytes is refused too, even with no slice directory
    // left (the run directory is a tmpfs that a reboot empties): egpud never
    // makes an empty store itself, so one is always damage.
    std::fs::write(&store, b"").unwrap();
    std::fs::remove_dir_all(node.run_dir().join("slices")).unwrap();
    let o = node.daemon_cmd().stdout(Stdio::null()).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("empty (0 bytes)") && err.contains("move it aside"), "{err}");
    assert_eq!(std::fs::metadata(&store).unwrap().len(), 0, "the file is left for the operator");
}

#[test]
fn wrong_version_slice_table_is_recreated_with_a_clear_log() {
    let mut node = Node::start("1x16GiB");
    node.ok(&["create", "--name", "old", "--gpu-memory", "2GiB"]);
    node.kill9();
    let limits = node.run_dir().join("slices/old/limits");
    let mut bytes = std::fs::read(&limits).unwrap();
    bytes[8..12].copy_from_slice(&7u32.to_le_bytes());
    std::fs::write(&limits, &bytes).unwrap();
    assert!(egpu_abi::LimitsReader::open(&limits).is_err());
    node.restart();
    let log = node.log();
    assert!(log.contains("recreated it from the store") && log.contains("ABI version 7"), "{log}");
    let lim = egpu_abi::LimitsReader::open(&limits).expect("recreated at the current ABI version");
    assert_eq!(lim.snapshot().devices()[0].mem_limit, 2 << 30);
    assert_eq!(node.slice("old")["devices"][0]["memory_limit_bytes"], 2u64 << 30);
}

#[test]
fn stale_socket_is_replaced_but_other_files_are_not() {
    let mut node = Node::start("1x16GiB");
    node.kill9();
    assert!(node.socket().exists(), "kill -9 leaves the socket file behind");
    node.restart(); // replaces the stale socket
    node.kill9();
    std::fs::remove_file(node.socket()).unwrap();
    std::fs::write(node.socket(), b"not a socket").unwrap();
    let o = node.daemon_cmd().stdout(Stdio::null()).output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("is not a socket; refusing to replace it"));
}

#[test]
fn simulate_flag_errors_exit_2_and_a_closed_stdout_is_no_error() {
    let dir = tempfile::tempdir().unwrap();
    let (nodes, pods, out) = (dir.path().join("nodes.csv"), dir.path().join("pods.csv"), dir.path().join("report"));
    std::fs::write(&nodes, "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\n").unwrap();
    std::fs::write(&pods, "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,4000,8192,1,500\n").unwrap();
    let sim = |extra: &[&str]| {
        let mut c = std::process::Command::new(EGPU);
        c.arg("simulate").arg("--node-list").arg(&nodes).arg("--pod-list").arg(&pods).arg("--out").arg(&out).args(["--no-progress", "--seeds", "1"]).args(extra);
        c
    };
    // Refused by the flag parser, and by the checks after it: both exit 2.
    assert_fails(&sim(&["--threads", "0"]).output().unwrap(), 2, &["--threads"]);
    assert_fails(&sim(&["--policies", "fgd,fgd"]).output().unwrap(), 2, &["'fgd' is listed twice"]);
    // A reader that went away before the summary is printed: the report is
    // written and the run succeeds, with no panic.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = sim(&["--policies", "fgd"]).stdout(writer).stderr(Stdio::piped()).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.join("summary.md").exists());
}

#[test]
fn a_listing_to_a_reader_that_went_away_is_no_error() {
    let node = Node::start("1x16GiB");
    node.ok(&["create", "--name", "x", "--gpu-memory", "1GiB"]);
    for args in [&["ls", "-o", "json"][..], &["devices"], &["create", "--name", "y", "--gpu-memory", "1GiB"]] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let o = node.cli().args(args).stdout(writer).stderr(Stdio::piped()).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // The create did its work although nobody read its output.
    assert_eq!(node.slices().len(), 2);
}

#[test]
fn zero_caps_short_intervals_and_a_missing_interposer_are_refused() {
    let node = Node::start("1x16GiB");
    let o = node.egpu(&["create", "--name", "x", "--gpu-memory", "1GiB", "--gpu-compute-limit", "0"]);
    assert_fails(&o, 2, &["a cap of 0% would never let the slice run"]);
    node.ok(&["create", "--name", "x", "--gpu-memory", "1GiB", "--gpu-compute", "30%", "--gpu-compute-limit", "30%"]);
    let o = node.egpu(&["resize", "x", "--gpu-compute-limit", "0%"]);
    assert_fails(&o, 2, &["a cap of 0%"]);
    assert_eq!(node.slice("x")["devices"][0]["compute_limit_percent"], 30.0, "the cap is unchanged");
    assert_fails(&node.egpu(&["top", "--interval", "0s"]), 2, &["at least 100ms"]);
    assert_fails(&node.egpu(&["bench", "resize", "--count", "0"]), 2, &["--count"]);
    assert_fails(&node.egpu(&["bench", "resize", "--step", "0"]), 2, &["above 0 bytes"]);
    // Refused before anything starts (no panic, no half-made node).
    assert_fails(&node.egpu(&["bench", "resize", "--step", "16000000TiB", "--count", "1"]), 2, &["--step", "past 16 EiB", "smaller"]);
    for args in [&["demo", "--force-simulated", "--simulate", "bogus"][..], &["bench", "resize", "--simulate", "bogus"][..]] {
        assert_fails(&node.egpu(args), 2, &["--simulate", "bogus"]);
    }
    // The live view needs a terminal; a pipe gets the plain-text alternative named.
    assert_fails(&node.egpu(&["top"]), 2, &["needs a terminal", "egpu top --once"]);
    // Quantities that cannot be what was meant are refused, not rounded.
    assert_fails(&node.egpu(&["create", "--name", "q", "--gpu-memory", "1.5B"]), 2, &["not a whole number of bytes"]);
    assert_fails(&node.egpu(&["create", "--name", "q", "--gpu-memory", "1GiB", "--gpu-compute", "12.345%"]), 2, &["finer than 0.01%"]);
    assert_fails(&node.egpu(&["create", "--name", "q", "--gpu-memory", "1GiB", "--gpu-compute", "100.0001%"]), 2, &["between 0% and 100%"]);
    // A name shaped like a slice id would make `rm s-…` ambiguous.
    let o = node.egpu(&["create", "--name", "s-0123456789ab", "--gpu-memory", "1GiB"]);
    assert_fails(&o, 2, &["has the form of a slice id"]);
    // egpud does not start without the library that enforces the limits.
    let dir = tempfile::tempdir().unwrap();
    let o = std::process::Command::new(EGPUD)
        .args(["--simulate", "1x1GiB", "--hook-lib", "/nonexistent/libegpu.so"])
        .arg("--run-dir")
        .arg(dir.path().join("run"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("/nonexistent/libegpu.so does not exist") && err.contains("--hook-lib"), "{err}");
    // A log filter tracing cannot read is refused, not replaced by another level.
    let o = std::process::Command::new(EGPUD).args(["--simulate", "1x1GiB", "--log", "info,a=b=c"]).output().unwrap();
    assert_fails(&o, 2, &["--log", "give a level"]);
    // The memory audit's flags.
    // A bad simulated-GPU spec is a usage error too, before anything starts.
    let o = std::process::Command::new(EGPUD).args(["--simulate", "0x16GiB"]).output().unwrap();
    assert_fails(&o, 2, &["--simulate", "device count must be 1..=64"]);
    let o = std::process::Command::new(EGPUD).args(["--simulate", "2xfoo"]).output().unwrap();
    assert_fails(&o, 2, &["--simulate", "'2xfoo'"]);
    let o = std::process::Command::new(EGPUD).args(["--simulate", "1x1GiB", "--memory-audit", "on"]).output().unwrap();
    assert_fails(&o, 2, &["--memory-audit", "use off, report or charge"]);
    let o = std::process::Command::new(EGPUD).args(["--simulate", "1x1GiB", "--memory-audit-slack", "64XB"]).output().unwrap();
    assert_fails(&o, 2, &["--memory-audit-slack", "64XB"]);
    let o = std::process::Command::new(EGPUD).args(["--simulate", "1x1GiB", "--sysfs", "/nonexistent-sysfs"]).output().unwrap();
    assert_fails(&o, 2, &["--sysfs", "/nonexistent-sysfs", "not a directory"]);
}

#[test]
fn egpu_run_removes_its_own_slice_not_one_that_took_its_name() {
    let node = Node::start("1x16GiB");
    // The program removes the run's slice and creates another by the same
    // name; when it exits, `egpu run` must leave that one alone.
    let script = format!("{EGPU} rm eph && {EGPU} create --name eph --gpu-memory 2GiB >/dev/null");
    let o = node.egpu(&["run", "--name", "eph", "--gpu-memory", "1GiB", "--", "sh", "-c", &script]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!String::from_utf8_lossy(&o.stderr).contains("could not remove"), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(node.slice("eph")["devices"][0]["memory_limit_bytes"], 2u64 << 30);
}

#[test]
fn a_restart_with_another_simulate_spec_says_why_it_cannot_start() {
    let mut node = Node::start("1x1GiB");
    node.terminate();
    node.spec = "2x1GiB".into();
    let o = node.daemon_cmd().output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("did not start") && err.contains("simgpu.state was made for another --simulate spec"), "{err}");
    assert!(!err.contains("is an NVIDIA driver installed"), "the hint for a machine without --simulate: {err}");
}
