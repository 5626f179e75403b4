//! The CLI end to end against a real egpud on simulated GPUs.

mod common;
use common::*;
use std::time::Duration;

#[test]
fn create_resize_ls_get_rm() {
    let node = Node::start("2x16GiB");
    let id = node.ok(&["create", "--name", "train", "--gpu-memory", "4GiB", "--gpu-compute", "30%", "--gpu-compute-limit", "80%", "--priority", "high"]);
    assert!(id.trim().starts_with("s-"), "{id}");
    node.ok(&["create", "--name", "pair", "--gpu-memory", "1.5GB", "--device", "0,1"]);

    let s = node.slice("train");
    assert_eq!(s["id"], id.trim());
    assert_eq!(s["priority"], "high");
    assert_eq!(s["devices"][0]["memory_limit_bytes"], 4u64 << 30);
    assert_eq!(s["devices"][0]["compute_share_percent"], 30.0);
    assert_eq!(s["devices"][0]["compute_limit_percent"], 80.0);
    let pair = node.slice("pair");
    assert_eq!(pair["devices"].as_array().unwrap().len(), 2);
    assert_eq!(pair["devices"][1]["memory_limit_bytes"], 1_500_000_000u64);

    let gen_before = s["generation"].as_u64().unwrap();
    let out = node.ok(&["resize", "train", "--gpu-memory", "6GiB", "--gpu-compute", "50%"]);
    assert!(out.contains("6GiB"), "{out}");
    let s = node.slice(id.trim()); // by id
    assert_eq!(s["devices"][0]["memory_limit_bytes"], 6u64 << 30);
    assert_eq!(s["devices"][0]["compute_share_percent"], 50.0);
    assert!(s["generation"].as_u64().unwrap() > gen_before);

    // The limits file itself carries the new limit (what the hook reads).
    let lim = egpu_abi::LimitsReader::open(&node.run_dir().join("slices/train/limits")).unwrap();
    assert_eq!(lim.snapshot().devices()[0].mem_limit, 6 << 30);

    let devs = node.json(&["devices", "-o", "json"]);
    assert_eq!(devs["devices"][0]["allocated_memory_bytes"], (6u64 << 30) + 1_500_000_000);
    assert_eq!(devs["devices"][0]["allocated_compute_percent"], 50.0);
    assert_eq!(devs["simulated"], true);

    let table = node.ok(&["ls"]);
    assert!(table.contains("train") && table.contains("6GiB") && table.contains("NAME"), "{table}");

    node.ok(&["rm", "train"]);
    node.ok(&["rm", "pair"]);
    assert!(node.slices().is_empty());
    assert!(!node.run_dir().join("slices/train").exists());
}

#[test]
fn run_passes_exit_status_env_and_removes_its_slice() {
    let node = Node::start("1x8GiB");
    let o = node.egpu(&["run", "--gpu-memory", "1GiB", "--", "sh", "-c", "exit 7"]);
    assert_eq!(o.status.code(), Some(7));
    let o = node.egpu(&["run", "--gpu-memory", "1GiB", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(o.status.code(), Some(128 + 15));
    let o = node.egpu(&["run", "--gpu-memory", "1GiB", "--", "/nonexistent/prog"]);
    assert_fails(&o, 127, &["cannot start /nonexistent/prog"]);

    let env = node.ok(&["run", "--name", "envcheck", "--gpu-memory", "1GiB", "--", "env"]);
    let has = |k: &str, v: &str| env.lines().any(|l| l.strip_prefix(k).and_then(|r| r.strip_prefix('=')).is_some_and(|x| x.contains(v)));
    assert!(has("EGPU_SLICE_DIR", "slices/envcheck"), "{env}");
    assert!(has("LD_PRELOAD", "libegpu.so"), "{env}");
    assert!(has("LD_LIBRARY_PATH", "run/simlib"), "{env}");
    assert!(has("CUDA_VISIBLE_DEVICES", &egpu_core::simspec::sim_uuid(0)), "{env}");
    assert!(has("EGPU_SIM_GPUS", "1x8GiB"), "{env}");
    assert!(has("EGPU_SIM_STATE", "simgpu.state"), "{env}");
    assert!(node.slices().is_empty(), "run slices are removed when the program exits");
}

#[test]
fn run_and_exec_pass_inherited_descriptors_to_the_program() {
    let node = Node::start("1x8GiB");
    let file = node.dir.path().join("fd3");
    std::fs::write(&file, "from fd 3\n").unwrap();
    node.ok(&["create", "--name", "f3", "--gpu-memory", "1MiB"]);
    for sub in ["exec f3", "run --gpu-memory 1MiB"] {
        // fd 3 and fd 4, as a shell or a make jobserver hands them on.
        let script = format!("exec 3<'{}' 4<'{}'; exec '{EGPU}' {sub} -- sh -c 'cat <&3; cat <&4'", file.display(), file.display());
        let o = std::process::Command::new("sh").arg("-c").arg(&script).env("EGPU_SOCKET", node.socket()).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&o.stdout), "from fd 3\nfrom fd 3\n", "egpu {sub}: {}", String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "egpu {sub}: {}", String::from_utf8_lossy(&o.stderr));
    }
}

#[test]
fn run_forwards_sigterm_to_the_program() {
    let node = Node::start("1x8GiB");
    let mark = node.dir.path().join("ready");
    let script = format!("trap 'exit 42' TERM; touch {}; while :; do sleep 0.05; done", mark.display());
    let mut cli = node.cli().args(["run", "--gpu-memory", "1GiB", "--", "sh", "-c", &script]).spawn().unwrap();
    assert!(wait_until(Duration::from_secs(20), || mark.exists()));
    signal(cli.id(), libc::SIGTERM);
    let st = cli.wait().unwrap();
    assert_eq!(st.code(), Some(42));
    assert!(node.slices().is_empty());
}

/// Ctrl-C in a terminal signals its whole foreground group, the CLI and
/// PROG alike: PROG must get it once, not a second time forwarded. A
/// pseudo-terminal stands in for the user's (python3's `pty`), and PROG
/// counts every SIGINT for a second after the first (`set_wakeup_fd`
/// writes a byte per delivery).
#[test]
fn a_terminal_ctrl_c_reaches_the_program_once_and_a_kill_of_the_cli_is_forwarded() {
    let node = Node::start("1x8GiB");
    let prog = "import signal,socket,sys,time\n\
r,w=socket.socketpair(); r.setblocking(False); w.setblocking(False)\n\
signal.signal(signal.SIGINT, lambda *a: None); signal.set_wakeup_fd(w.fileno())\n\
open(sys.argv[1],'w').close()\n\
end=time.time()+30\n\
n=0\n\
while not n and time.time()<end:\n    time.sleep(0.01)\n    try: n=len(r.recv(100))\n    except BlockingIOError: pass\n\
t=time.time()\n\
while time.time()-t < 1:\n    time.sleep(0.05)\n    try: n+=len(r.recv(100))\n    except BlockingIOError: pass\n\
open(sys.argv[2],'w').write(str(n))\n";
    let driver = "import os,pty,sys,time\n\
egpu,prog,mark,count,how=sys.argv[1:6]\n\
pid,fd=pty.fork()\n\
if pid==0:\n    os.execv(egpu,[egpu,'run','--gpu-memory','1MiB','--',sys.executable,'-c',prog,mark,count])\n\
end=time.time()+30\n\
while not os.path.exists(mark):\n    assert time.time()<end, 'PROG never started'\n    time.sleep(0.01)\n\
if how=='tty': os.write(fd,b'\\x03')\n\
else: os.kill(pid,2)\n\
out=b''\n\
while True:\n    try: b=os.read(fd,4096)\n    except OSError: break\n    if not b: break\n    out+=b\n\
_,st=os.waitpid(pid,0)\n\
sys.stdout.write(out.decode(errors='replace'))\n\
sys.exit(os.waitstatus_to_exitcode(st))\n";
    for (how, want) in [("tty", "1"), ("kill", "1")] {
        let (mark, count) = (node.dir.path().join(format!("ready-{how}")), node.dir.path().join(format!("count-{how}")));
        let o = std::process::Command::new("python3").args(["-c", driver, EGPU, prog]).arg(&mark).arg(&count).arg(how).env("EGPU_SOCKET", node.socket()).output().unwrap();
        assert!(o.status.success(), "{how}: {} {}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        // ^C: the terminal's delivery only; a SIGINT to the CLI alone: forwarded once.
        assert_eq!(std::fs::read_to_string(&count).unwrap(), want, "{how}: PROG's SIGINT count");
    }
    assert!(node.slices().is_empty());
}

/// Waits until the sweeper has run twice more (it refreshes the heartbeat of every
/// limits file, then collects orphans, in one tick): a collection has run since the call.
fn wait_two_sweeps(node: &Node, slice: &str) {
    let lim = egpu_abi::LimitsReader::open(&node.run_dir().join("slices").join(slice).join("limits")).unwrap();
    let beat = || lim.region().agent_heartbeat_ns.load(std::sync::atomic::Ordering::Acquire);
    for _ in 0..2 {
        let before = beat();
        assert!(wait_until(Duration::from_secs(10), || beat() != before), "sweeper did not run");
    }
}

#[test]
fn run_leaves_a_slice_its_program_left_processes_in_to_the_sweeper() {
    let node = Node::start("1x8GiB");
    let out = node.dir.path().join("probe.out");
    // PROG starts a probe in the background, on PROG's own stdin (a
    // background job's is /dev/null otherwise), waits until it holds its
    // memory, and exits.
    let script = format!(
        "exec 3<&0; {} grow --step 256MiB --until 256MiB --hold <&3 >{out} 2>&1 & until grep -q holding {out} 2>/dev/null; do sleep 0.05; done",
        probe_path().display(),
        out = out.display()
    );
    let mut cli = node
        .cli()
        .args(["run", "--name", "bg", "--gpu-memory", "1GiB", "--", "sh", "-c", &script])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = cli.stdin.take().unwrap();
    let o = cli.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("still attached to slice bg"), "{err}");
    // PROG and the CLI are gone; the probe still holds its memory in its slice.
    let s = node.slice("bg");
    assert_eq!(live_pids(std::slice::from_ref(&s)).len(), 1, "{s}");
    assert!(s["devices"][0]["used_bytes"].as_u64().unwrap() >= 256 << 20, "{s}");
    assert_eq!(s["devices"][0]["memory_limit_bytes"], 1u64 << 30, "the reservation stays");
    wait_two_sweeps(&node, "bg");
    assert_eq!(node.slices().len(), 1, "slice removed under a live process");
    // The probe exits when its stdin closes; then the sweeper removes the slice.
    drop(stdin);
    assert!(wait_until(Duration::from_secs(20), || node.slices().is_empty()), "slice not collected after its last process exited: {:?}", node.slices());
}

#[test]
fn ephemeral_slice_of_a_killed_cli_lives_until_its_program_exits() {
    let node = Node::start("1x8GiB");
    let pidfile = node.dir.path().join("child.pid");
    // The program never makes an intercepted call: it has no usage record.
    let script = format!("echo $$ > {}; exec sleep 60", pidfile.display());
    let mut cli = node.cli().args(["run", "--name", "eph", "--gpu-memory", "1GiB", "--", "sh", "-c", &script]).spawn().unwrap();
    assert!(wait_until(Duration::from_secs(20), || std::fs::read_to_string(&pidfile).is_ok_and(|s| s.ends_with('\n'))));
    let child: u32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    assert!(wait_until(Duration::from_secs(20), || node.log().contains("workload registered")), "{}", node.log());
    let s = node.slice("eph");
    assert_eq!(s["ephemeral"], true);
    assert_eq!(s["owner_pid"], cli.id());
    assert!(live_pids(&node.slices()).is_empty(), "the program has not allocated");
    cli.kill().unwrap();
    cli.wait().unwrap();
    wait_two_sweeps(&node, "eph");
    assert_eq!(node.slices().len(), 1, "slice removed under its running program");
    signal(child, libc::SIGKILL);
    assert!(wait_until(Duration::from_secs(10), || node.slices().is_empty()), "orphaned slice not collected: {:?}", node.slices());
}

// EGPU_TEST_EXIT_BEFORE_REGISTER exists only in debug builds of the CLI.
#[cfg(debug_assertions)]
#[test]
fn a_cli_killed_before_registering_its_program_never_starts_it() {
    // The CLI (debug build) exits right after starting the held program and
    // before telling egpud its pid: the slice is collected, so the program
    // must not run (it would run in a slice that is gone).
    let node = Node::start("1x8GiB");
    let marker = node.dir.path().join("started");
    let script = format!("touch {}; exec sleep 60", marker.display());
    let out = node.cli().env("EGPU_TEST_EXIT_BEFORE_REGISTER", "1").args(["run", "--name", "early", "--gpu-memory", "1GiB", "--", "sh", "-c", &script]).output().unwrap();
    assert_eq!(out.status.code(), Some(99), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    let held: u32 = err.split("before registering pid ").nth(1).and_then(|r| r.split_whitespace().next()).and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("no pid in {err}"));
    // The held process sees EOF and exits (a zombie until its new parent reaps it).
    let gone = || std::fs::read_to_string(format!("/proc/{held}/stat")).map_or(true, |st| st.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')));
    assert!(wait_until(Duration::from_secs(10), gone), "held process {held} still running");
    assert!(!marker.exists(), "the program ran although its pid was never registered");
    assert!(wait_until(Duration::from_secs(10), || node.slices().is_empty()), "slice of a dead CLI not collected: {:?}", node.slices());
}

#[test]
fn exec_and_env_use_the_named_slice() {
    let node = Node::start("2x8GiB");
    node.ok(&["create", "--name", "svc", "--gpu-memory", "2GiB", "--device", "1"]);
    let out = node.ok(&["exec", "svc", "--", "sh", "-c", "echo $EGPU_SLICE_DIR $CUDA_VISIBLE_DEVICES; exit 0"]);
    assert!(out.contains("slices/svc") && out.contains(&egpu_core::simspec::sim_uuid(1)), "{out}");
    let exports = node.ok(&["env", "svc"]);
    assert!(exports.contains("export EGPU_SLICE_DIR='") && exports.contains("export LD_PRELOAD='"), "{exports}");
    let o = node.egpu(&["exec", "svc", "--", "sh", "-c", "exit 3"]);
    assert_eq!(o.status.code(), Some(3));
    assert_eq!(node.slices().len(), 1, "exec leaves the slice in place");
}

#[test]
fn graceful_stop_keeps_slices_and_restart_adopts_them() {
    let mut node = Node::start("2x16GiB");
    node.ok(&["create", "--name", "a", "--gpu-memory", "3GiB", "--gpu-compute", "25%"]);
    node.ok(&["create", "--name", "b", "--gpu-memory", "1GiB", "--device", "0,1", "--priority", "best-effort"]);
    node.ok(&["resize", "a", "--gpu-memory", "5GiB"]);
    let before = node.slices();
    let st = node.terminate();
    assert!(st.success(), "{st}");
    assert!(!node.socket().exists(), "socket removed on shutdown");
    assert!(node.run_dir().join("slices/a/limits").exists(), "slices stay");
    node.restart();
    let after = node.slices();
    // The generation, and the memory audit's readings (none yet after a start).
    let strip = |v: &[serde_json::Value]| {
        v.iter()
            .map(|s| {
                let mut s = s.clone();
                s["generation"] = 0.into();
                for d in s["devices"].as_array_mut().unwrap() {
                    d.as_object_mut().unwrap().remove("driver_used_bytes");
                }
                s
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(&before), strip(&after));
    assert!(node.log().contains("adopted slice"), "{}", node.log());
}

/// `egpu run` in a container sends its own pid as its pid namespace numbers
/// it (1 here); egpud takes the caller's pid from the socket and records the
/// owner as its own namespace sees it, not whatever process is 1 there.
#[test]
fn egpu_run_from_another_pid_namespace_is_owned_by_its_real_process() {
    let probe = std::process::Command::new("unshare").args(["-Urp", "--fork", "true"]).output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: `unshare -Urp --fork` does not work here: {probe:?}");
        return;
    }
    let node = Node::start("1x16GiB");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("nspid");
    // /proc is still egpud's, so the owner egpud recorded can be looked up from inside.
    let script = format!(
        "o=$({EGPU} get eph -o json | grep -o '\"owner_pid\": *[0-9]*' | grep -o '[0-9]*$') && grep NSpid /proc/$o/status > {}",
        out.display()
    );
    let o = std::process::Command::new("unshare")
        .args(["-Urp", "--fork", EGPU, "run", "--name", "eph", "--gpu-memory", "1GiB", "--", "sh", "-c", &script])
        .env("EGPU_SOCKET", node.socket())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let nspid = std::fs::read_to_string(&out).unwrap();
    let ids: Vec<&str> = nspid.split_whitespace().skip(1).collect();
    assert_eq!(ids.len(), 2, "the owner lives in a nested pid namespace: {nspid}");
    assert_eq!(ids[1], "1", "the owner is the CLI, pid 1 of its namespace: {nspid}");
    assert_ne!(ids[0], "1", "egpud recorded it by its own namespace's pid: {nspid}");
    assert!(node.slices().is_empty(), "egpu run removed its slice");
}

/// A stored slice whose files egpud cannot open is not listed (it has no
/// limits egpud can read), but `egpu ls` says which one and why, so memory
/// that no listed slice accounts for is explained; once the file is back,
/// a sweep adopts it and it is listed again.
#[test]
fn ls_names_a_slice_egpud_could_not_adopt() {
    let mut node = Node::start("1x16GiB");
    node.ok(&["create", "--name", "g", "--gpu-memory", "2GiB"]);
    node.ok(&["create", "--name", "ok", "--gpu-memory", "1GiB"]);
    node.kill9();
    let limits = node.run_dir().join("slices/g/limits");
    let aside = node.run_dir().join("g.limits");
    std::fs::rename(&limits, &aside).unwrap();
    std::fs::create_dir(&limits).unwrap();
    node.restart();
    let o = node.egpu(&["ls"]);
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success() && out.contains("ok") && !out.lines().any(|l| l.starts_with("g ")), "{out}\n{err}");
    assert!(err.contains("slice 'g'") && err.contains("could not open its slice-table files") && err.contains("reserved"), "{err}");
    // JSON on stdout stays a list of the adopted slices; the note goes to stderr.
    let o = node.egpu(&["ls", "-o", "json"]);
    let names: Vec<String> = serde_json::from_slice::<Vec<serde_json::Value>>(&o.stdout).unwrap().iter().map(|s| s["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(names, ["ok"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("slice 'g'"));
    // The file back: adopted by a sweep, listed, and no note.
    std::fs::remove_dir(&limits).unwrap();
    std::fs::rename(&aside, &limits).unwrap();
    assert!(wait_until(Duration::from_secs(30), || node.slices().iter().any(|s| s["name"] == "g")), "{}", node.log());
    assert!(!String::from_utf8_lossy(&node.egpu(&["ls"]).stderr).contains("slice 'g'"));
}
