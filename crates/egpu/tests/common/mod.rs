//! Test harness: a simulated node (egpud in temp dirs) and the egpu CLI.
//! Every process started here is killed by pid; waits poll a condition with
//! a bounded deadline.
#![allow(dead_code)]

pub mod dra;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const EGPUD: &str = env!("CARGO_BIN_EXE_egpud");
pub const EGPU: &str = env!("CARGO_BIN_EXE_egpu");

/// GET `path` over HTTP/1.1: (status code, content type, body). The
/// chunk-size lines of a chunked body are dropped, so the samples of a
/// scrape are lines of the body either way.
pub fn http_get(addr: &str, path: &str) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let code = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let ctype = head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type: ").map(str::to_string)).unwrap_or_default();
    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
    let body = if chunked { body.lines().filter(|l| l.is_empty() || !l.chars().all(|c| c.is_ascii_hexdigit())).collect::<Vec<_>>().join("\n") } else { body.to_string() };
    (code, ctype, body)
}

/// A scrape of the metrics of a process whose log (read by `log`) names
/// its address, as `--metrics-listen` logs it: the last one named, once
/// named (a restarted process appends its own).
pub fn scrape_logged(log: impl Fn() -> String) -> String {
    const AT: &str = "serving metrics at http://";
    let mut addr = None;
    assert!(
        wait_until(Duration::from_secs(30), || {
            addr = log().rsplit_once(AT).and_then(|(_, rest)| rest.split_once("/metrics")).map(|(a, _)| a.to_string());
            addr.is_some()
        }),
        "no metrics address in the log:\n{}",
        log()
    );
    let (code, ctype, body) = http_get(&addr.unwrap(), "/metrics");
    assert_eq!(code, 200, "{body}");
    assert!(ctype.starts_with("application/openmetrics-text"), "{ctype}");
    body
}

/// The value of one sample (`name{labels}`, exactly as exposed) in a scrape.
pub fn sample(scrape: &str, series: &str) -> Option<f64> {
    scrape.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.split(' ').next()?.trim().parse().ok())
}

/// target/<profile>/, where cargo puts the binaries and the cdylibs.
pub fn target_dir() -> PathBuf {
    Path::new(EGPUD).parent().unwrap().to_path_buf()
}

pub fn probe_path() -> PathBuf {
    target_dir().join("egpu-probe")
}

/// Polls `cond` until it holds or `timeout` passes; returns whether it held.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub struct Node {
    pub dir: tempfile::TempDir,
    pub spec: String,
    pub daemon: Option<Child>,
    /// More egpud flags.
    pub extra: Vec<String>,
    /// More environment for egpud (e.g. the simulated driver's `EGPU_SIM_NVLINK`).
    pub env: Vec<(String, String)>,
}

impl Node {
    pub fn run_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }
    pub fn socket(&self) -> PathBuf {
        self.run_dir().join("egpud.sock")
    }
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("egpud.log")
    }
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Starts egpud on `spec` simulated GPUs and waits until it answers.
    pub fn start(spec: &str) -> Node {
        Node::start_with(spec, &[])
    }

    /// Starts egpud with more flags.
    pub fn start_with(spec: &str, extra: &[&str]) -> Node {
        Node::start_env(spec, extra, &[])
    }

    /// Starts egpud with more flags and environment.
    pub fn start_env(spec: &str, extra: &[&str], env: &[(&str, &str)]) -> Node {
        let mut n = Node {
            dir: tempfile::tempdir().unwrap(),
            spec: spec.into(),
            daemon: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        };
        n.restart();
        n
    }

    /// The egpud command line of this node.
    pub fn daemon_cmd(&self) -> Command {
        let mut c = Command::new(EGPUD);
        c.args(["--simulate", &self.spec, "--log", "info"]).arg("--run-dir").arg(self.run_dir()).arg("--state-dir").arg(self.state_dir()).args(&self.extra);
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c
    }

    /// Starts egpud (again) and waits until the socket answers.
    pub fn restart(&mut self) {
        assert!(self.daemon.is_none(), "egpud already running");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log_path()).unwrap();
        let mut child = self.daemon_cmd().stdout(Stdio::null()).stderr(log).spawn().unwrap();
        let ok = wait_until(Duration::from_secs(30), || {
            if let Ok(Some(st)) = child.try_wait() {
                panic!("egpud exited with {st} while starting; log:\n{}", self.log());
            }
            self.egpu(&["devices", "-o", "json"]).status.success()
        });
        assert!(ok, "egpud did not answer within 30 s; log:\n{}", self.log());
        self.daemon = Some(child);
    }

    pub fn daemon_pid(&self) -> u32 {
        self.daemon.as_ref().unwrap().id()
    }

    /// SIGKILLs egpud (a crash) and reaps it.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.daemon.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// SIGTERMs egpud and waits for it to exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.daemon.take().unwrap();
        signal(c.id(), libc::SIGTERM);
        let mut st = None;
        assert!(wait_until(Duration::from_secs(20), || {
            st = c.try_wait().unwrap();
            st.is_some()
        }));
        st.unwrap()
    }

    pub fn cli(&self) -> Command {
        let mut c = Command::new(EGPU);
        c.env("EGPU_SOCKET", self.socket());
        c
    }

    pub fn egpu(&self, args: &[&str]) -> Output {
        self.cli().args(args).output().unwrap()
    }

    /// Runs `egpu args` and asserts success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.egpu(args);
        assert!(o.status.success(), "egpu {args:?} failed: {}\n{}", String::from_utf8_lossy(&o.stderr), String::from_utf8_lossy(&o.stdout));
        String::from_utf8(o.stdout).unwrap()
    }

    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        serde_json::from_str(&self.ok(args)).unwrap()
    }

    /// `egpu ls -o json` as a value.
    pub fn slices(&self) -> Vec<serde_json::Value> {
        self.json(&["ls", "-o", "json"]).as_array().unwrap().clone()
    }

    pub fn slice(&self, name: &str) -> serde_json::Value {
        self.json(&["get", name, "-o", "json"])
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a pid this test started and has not reaped.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Asserts `o` failed with exit code `code` and stderr containing every `needle`.
pub fn assert_fails(o: &Output, code: i32, needles: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "stderr: {err}");
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}: {err}");
    }
}

/// A child whose stdout JSON lines arrive on a channel (read by a thread), so
/// a test can wait for an event with a deadline.
pub struct Lines {
    pub child: Child,
    rx: std::sync::mpsc::Receiver<String>,
    pub seen: Vec<String>,
}

impl Lines {
    pub fn spawn(mut cmd: Command) -> Lines {
        let mut child = cmd.stdout(Stdio::piped()).stdin(Stdio::piped()).spawn().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines { child, rx, seen: Vec::new() }
    }

    /// Waits up to `timeout` for a JSON line whose "event" is `event`.
    pub fn wait_event(&mut self, event: &str, timeout: Duration) -> Option<serde_json::Value> {
        let end = Instant::now() + timeout;
        loop {
            let left = end.checked_duration_since(Instant::now())?;
            let line = self.rx.recv_timeout(left).ok()?;
            self.seen.push(line.clone());
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
                && v["event"] == event
            {
                return Some(v);
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Closes stdin (a probe holding memory then exits) and waits up to `timeout`.
    pub fn finish(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        drop(self.child.stdin.take());
        let mut st = None;
        wait_until(timeout, || {
            st = self.child.try_wait().unwrap();
            st.is_some()
        });
        st
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Node {
    /// The environment `egpu env NAME` prints, as (name, value) pairs.
    pub fn slice_env(&self, name: &str) -> Vec<(String, String)> {
        self.ok(&["env", name])
            .lines()
            .filter_map(|l| {
                let (k, v) = l.strip_prefix("export ")?.split_once('=')?;
                Some((k.to_string(), v.trim_matches('\'').to_string()))
            })
            .collect()
    }

    /// `GetNode`'s per-device `driver_used_bytes` (the simulated driver's NVML view).
    pub fn driver_used(&self) -> Vec<u64> {
        let n = self.json(&["devices", "-o", "json"]);
        n["devices"].as_array().unwrap().iter().map(|d| d["driver_used_bytes"].as_u64().unwrap()).collect()
    }
}

/// A slice listing without the fields that change while workloads run.
pub fn limits_only(slices: &[serde_json::Value]) -> Vec<serde_json::Value> {
    slices
        .iter()
        .map(|s| {
            let mut s = s.clone();
            let o = s.as_object_mut().unwrap();
            o.remove("generation");
            o.remove("processes");
            for d in o["devices"].as_array_mut().unwrap() {
                let d = d.as_object_mut().unwrap();
                d.remove("used_bytes");
                d.remove("refused_allocations");
                // The memory audit's readings.
                d.remove("driver_used_bytes");
                d.remove("untracked_bytes");
            }
            s
        })
        .collect()
}

/// Live pids egpud lists in each slice's usage records.
pub fn live_pids(slices: &[serde_json::Value]) -> Vec<u32> {
    slices
        .iter()
        .flat_map(|s| s["processes"].as_array().unwrap().iter().filter(|p| p["alive"] == true).map(|p| p["pid"].as_u64().unwrap() as u32))
        .collect()
}

/// Serves an API-server stand-in on a free loopback port, on `rt`; returns
/// a kubeconfig (in `dir`) that names it.
pub fn serve_api(rt: &tokio::runtime::Runtime, dir: &Path, app: axum::Router) -> PathBuf {
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(async move { axum::serve(listener, app).await });
    kubeconfig(dir, addr)
}

/// Writes a kubeconfig naming an API-server stand-in at `addr` (plain
/// HTTP, a dummy token) into `dir`; returns its path.
pub fn kubeconfig(dir: &Path, addr: std::net::SocketAddr) -> PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://{addr}\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"),
    )
    .unwrap();
    path
}
