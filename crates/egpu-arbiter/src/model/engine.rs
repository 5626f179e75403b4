//! The event loop of the model.

use crate::arbiter::{Arbiter, ArbiterConfig, SliceInput, SliceKey};
use crate::gate::{Decision, GateView, GateWords, Peers, ProcGate};
use crate::measure::StreamClock;
use egpu_abi::ProcRecord;
use egpu_abi::usage::{CAP_PEER_INFLIGHT, CAP_TURNS};
use egpu_core::Priority;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::Relaxed;

/// What one process does, forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Keeps up to `ahead` kernels of `kernel_ns` unfinished (a training
    /// loop; `ahead` in the thousands is a program that launches far ahead).
    Saturate { kernel_ns: u64, ahead: u32 },
    /// Launches `kernels` kernels, synchronises, thinks `think_ns`; records
    /// each iteration's latency (first launch attempt to sync return).
    Latency { kernels: u32, kernel_ns: u64, think_ns: u64 },
    /// Saturates during `on_ns`, idles `off_ns`, repeatedly.
    OnOff { kernel_ns: u64, ahead: u32, on_ns: u64, off_ns: u64 },
}

/// A slice of the model: its compute spec and its processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceSpec {
    pub share_bps: u32,
    pub limit_bps: u32,
    pub priority: Priority,
    pub procs: Vec<Pattern>,
}

impl SliceSpec {
    /// A slice of one process, shares in percent.
    pub fn one(share: u32, limit: u32, priority: Priority, pattern: Pattern) -> SliceSpec {
        SliceSpec { share_bps: share * 100, limit_bps: limit * 100, priority, procs: vec![pattern] }
    }
}

/// Model settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelConfig {
    pub arbiter: ArbiterConfig,
    /// CPU time of one launch call, ns.
    pub launch_cpu_ns: u64,
    /// Give the arbiter the device's true per-slice time.
    pub reconcile: bool,
    /// Gate launches at all (false: no compute isolation, the baseline).
    pub gate: bool,
    /// The processes of a slice count each other's unfinished work (the
    /// usage records' `inflight_us`; false: each checks only its own, as
    /// hooks before it did).
    pub peers: bool,
    /// Under a queue bound of one launch, the slice's processes take turns
    /// at the slice's one launch (`CAP_TURNS`; false: the bound holds per
    /// process, as hooks before it did).
    pub turns: bool,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig { arbiter: ArbiterConfig::default(), launch_cpu_ns: 5_000, reconcile: true, gate: true, peers: true, turns: true }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Tick,
    DeviceDone,
    Wake(usize, u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blocked {
    No,
    /// Waits for one of its own kernels to finish (gate drain or app queue full).
    OwnCompletion,
    /// Latency pattern: waits for all its kernels.
    Sync,
    /// Asleep until a scheduled wake (think, off window, budget wait).
    Sleep,
}

#[derive(Debug, Clone, Copy)]
struct Kernel {
    proc: usize,
    dur: u64,
    submit: u64,
    est: u64,
}

#[derive(Debug)]
struct Proc {
    slice: usize,
    /// Its record among the slice's.
    rec: usize,
    pattern: Pattern,
    gate: ProcGate,
    clock: StreamClock,
    outstanding: u32,
    max_outstanding: u32,
    blocked: Blocked,
    wake_gen: u64,
    iter_start: u64,
    iter_left: u32,
    budget_wait_since: Option<u64>,
    /// Asleep on its bell, waiting for its turn at the slice's one launch.
    turn_wait: bool,
}

#[derive(Debug)]
struct Slice {
    spec: SliceSpec,
    words: GateWords,
    /// One usage record per process, as in the slice's usage file.
    records: Vec<ProcRecord>,
    high_water: AtomicU32,
    true_ns: u64,
    latencies: Vec<u64>,
}

/// The model: a device, slices, their processes, the arbiter, a clock.
#[derive(Debug)]
pub struct Model {
    cfg: ModelConfig,
    now: u64,
    seq: u64,
    events: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    slices: Vec<Slice>,
    procs: Vec<Proc>,
    queue: VecDeque<Kernel>,
    running: Option<Kernel>,
    arbiter: Arbiter,
    /// At every tick: its time and each slice's cumulative true GPU time.
    pub ticks: Vec<(u64, Vec<u64>)>,
}

impl Model {
    pub fn new(cfg: ModelConfig, specs: Vec<SliceSpec>) -> Model {
        let mut m = Model {
            cfg,
            now: 0,
            seq: 0,
            events: BinaryHeap::new(),
            slices: Vec::new(),
            procs: Vec::new(),
            queue: VecDeque::new(),
            running: None,
            arbiter: Arbiter::new(cfg.arbiter),
            ticks: Vec::new(),
        };
        for (si, spec) in specs.into_iter().enumerate() {
            for (rec, &pattern) in spec.procs.iter().enumerate() {
                m.procs.push(Proc {
                    slice: si,
                    rec,
                    pattern,
                    gate: ProcGate::new(),
                    clock: StreamClock::default(),
                    outstanding: 0,
                    max_outstanding: 0,
                    blocked: Blocked::Sleep,
                    wake_gen: 0,
                    iter_start: 0,
                    iter_left: 0,
                    budget_wait_since: None,
                    turn_wait: false,
                });
            }
            let records: Vec<ProcRecord> = spec.procs.iter().map(|_| ProcRecord::default()).collect();
            for r in &records {
                r.state.store(1, Relaxed);
                r.caps.store(CAP_PEER_INFLIGHT | if cfg.turns { CAP_TURNS } else { 0 }, Relaxed);
            }
            let high_water = AtomicU32::new(records.len() as u32);
            m.slices.push(Slice { spec, words: GateWords::default(), records, high_water, true_ns: 0, latencies: Vec::new() });
        }
        m.push(0, Ev::Tick);
        for p in 0..m.procs.len() {
            // Stagger starts a little so processes do not move in lockstep.
            m.wake_at(p, 1 + p as u64 * 1_000);
        }
        m
    }

    /// Process `p`'s gate view of its slice.
    fn view(&self, p: usize) -> GateView<'_> {
        let pr = &self.procs[p];
        let s = &self.slices[pr.slice];
        let v = s.words.view(s.spec.limit_bps);
        if !self.cfg.peers {
            return v;
        }
        GateView { peers: Some(Peers { records: &s.records, high_water: &s.high_water, own: Some(pr.rec), dev: 0, publish: true }), ..v }
    }

    fn push(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.events.push(Reverse((t, self.seq, ev)));
    }

    fn wake_at(&mut self, p: usize, t: u64) {
        let pr = &mut self.procs[p];
        pr.wake_gen += 1;
        pr.turn_wait = false;
        pr.blocked = Blocked::Sleep;
        let wake_gen = pr.wake_gen;
        self.push(t, Ev::Wake(p, wake_gen));
    }

    /// Virtual time now, ns.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Changes a slice's compute share and limit (percent); the arbiter sees
    /// it at its next tick, as `egpud` would after a seqlocked publish.
    pub fn resize(&mut self, slice: usize, share: u32, limit: u32) {
        self.slices[slice].spec.share_bps = share * 100;
        self.slices[slice].spec.limit_bps = limit * 100;
    }

    /// Cumulative true GPU time of a slice.
    pub fn true_ns(&self, slice: usize) -> u64 {
        self.slices[slice].true_ns
    }

    /// Iteration latencies of a slice's latency-pattern processes.
    pub fn latencies(&self, slice: usize) -> &[u64] {
        &self.slices[slice].latencies
    }

    /// Most kernels any process of the slice ever had unfinished.
    pub fn max_outstanding(&self, slice: usize) -> u32 {
        self.procs.iter().filter(|p| p.slice == slice).map(|p| p.max_outstanding).max().unwrap_or(0)
    }

    /// Runs until virtual time `t`.
    pub fn run_until(&mut self, t: u64) {
        while let Some(&Reverse((at, _, _))) = self.events.peek() {
            if at > t {
                break;
            }
            let Some(Reverse((at, _, ev))) = self.events.pop() else { break };
            self.now = at;
            match ev {
                Ev::Tick => self.tick(),
                Ev::DeviceDone => self.device_done(),
                Ev::Wake(p, wake_gen) => {
                    if self.procs[p].wake_gen == wake_gen && self.procs[p].blocked == Blocked::Sleep {
                        self.procs[p].blocked = Blocked::No;
                        self.step(p);
                    }
                }
            }
        }
        self.now = t;
    }

    fn tick(&mut self) {
        let inputs: Vec<SliceInput> = self
            .slices
            .iter()
            .enumerate()
            .map(|(i, s)| SliceInput {
                key: SliceKey { slice: i as u64, dev: 0 },
                device: 0,
                share_bps: s.spec.share_bps,
                limit_bps: s.spec.limit_bps,
                priority: s.spec.priority,
                consumed_ns: s.words.consumed_ns.load(Relaxed),
                throttle_waits: s.words.throttle_waits.load(Relaxed),
                true_ns: self.cfg.reconcile.then_some(s.true_ns),
            })
            .collect();
        let budgets = self.arbiter.tick(&inputs);
        for (s, b) in self.slices.iter().zip(&budgets) {
            let w = &s.words;
            w.period_ns.store(self.cfg.arbiter.period_ns, Relaxed);
            w.queue_launches.store(b.queue_launches, Relaxed);
            w.queue_ns.store(b.queue_ns, Relaxed);
            w.epoch_start_ns.store(self.now, Relaxed);
            w.allowance_ns.store(b.allowance_ns, Relaxed);
        }
        self.ticks.push((self.now, self.slices.iter().map(|s| s.true_ns).collect()));
        let next = self.now + self.cfg.arbiter.period_ns;
        self.push(next, Ev::Tick);
    }

    /// The process acts at `now`: launches, or blocks.
    fn step(&mut self, p: usize) {
        let now = self.now;
        let pattern = self.procs[p].pattern;
        if let Some(since) = self.procs[p].budget_wait_since.take() {
            self.procs[p].gate.waited(&self.view(p), now - since, None);
        }
        let kernel_ns = match pattern {
            Pattern::Saturate { kernel_ns, ahead } => {
                if self.procs[p].outstanding >= ahead {
                    self.procs[p].blocked = Blocked::OwnCompletion;
                    return;
                }
                kernel_ns
            }
            Pattern::OnOff { kernel_ns, ahead, on_ns, off_ns } => {
                let cycle = on_ns + off_ns;
                let phase = now % cycle;
                if phase >= on_ns {
                    self.wake_at(p, now - phase + cycle);
                    return;
                }
                if self.procs[p].outstanding >= ahead {
                    self.procs[p].blocked = Blocked::OwnCompletion;
                    return;
                }
                kernel_ns
            }
            Pattern::Latency { kernels, kernel_ns, .. } => {
                let pr = &mut self.procs[p];
                if pr.iter_left == 0 && pr.outstanding == 0 {
                    pr.iter_start = now;
                    pr.iter_left = kernels;
                }
                if pr.iter_left == 0 {
                    pr.blocked = Blocked::Sync;
                    return;
                }
                kernel_ns
            }
        };
        let decision = if self.cfg.gate { self.procs[p].gate.before_launch(&self.view(p), now) } else { Decision::Go };
        match decision {
            Decision::Go => {
                let est = if self.cfg.gate { self.procs[p].gate.launched(&self.view(p)) } else { 0 };
                let pr = &mut self.procs[p];
                pr.outstanding += 1;
                pr.max_outstanding = pr.max_outstanding.max(pr.outstanding);
                if let Pattern::Latency { .. } = pattern {
                    pr.iter_left -= 1;
                }
                self.queue.push_back(Kernel { proc: p, dur: kernel_ns, submit: now, est });
                self.start_device();
                let t = now + self.cfg.launch_cpu_ns;
                self.wake_at(p, t);
            }
            Decision::Drain => self.procs[p].blocked = Blocked::OwnCompletion,
            Decision::WaitUntil(t) => {
                self.procs[p].budget_wait_since = Some(now);
                self.wake_at(p, t.max(now + 1));
            }
            Decision::Yield { until, ring, .. } => {
                self.wake_at(p, until.max(now + 1));
                self.procs[p].turn_wait = true;
                // The rung waiter, asleep on its bell, wakes now (after the
                // ringer's futex call).
                let slice = self.procs[p].slice;
                if let Some(q) = ring.and_then(|r| self.procs.iter().position(|x| x.slice == slice && x.rec == r))
                    && self.procs[q].blocked == Blocked::Sleep
                    && self.procs[q].turn_wait
                {
                    self.wake_at(q, now + self.cfg.launch_cpu_ns);
                }
            }
        }
    }

    fn start_device(&mut self) {
        if self.running.is_none()
            && let Some(k) = self.queue.pop_front()
        {
            self.running = Some(k);
            self.push(self.now + k.dur, Ev::DeviceDone);
        }
    }

    fn device_done(&mut self) {
        let Some(k) = self.running.take() else { return };
        let now = self.now;
        let p = k.proc;
        let s = self.procs[p].slice;
        self.slices[s].true_ns += k.dur;
        let measured = self.procs[p].clock.attribute(k.submit, now);
        if self.cfg.gate {
            self.procs[p].gate.completed(&self.view(p), k.est, measured, None);
        } else {
            self.slices[s].words.consumed_ns.fetch_add(measured, Relaxed);
        }
        self.procs[p].outstanding -= 1;
        match self.procs[p].blocked {
            Blocked::OwnCompletion => {
                self.procs[p].blocked = Blocked::No;
                self.step(p);
            }
            Blocked::Sync if self.procs[p].outstanding == 0 => {
                let start = self.procs[p].iter_start;
                self.slices[s].latencies.push(now - start);
                let Pattern::Latency { think_ns, .. } = self.procs[p].pattern else { unreachable!("sync only in latency") };
                self.wake_at(p, now + think_ns);
            }
            _ => {}
        }
        self.start_device();
    }
}
impl Model {
    /// A slice's (allowance, consumed, throttle waits) slice-table words.
    pub fn words(&self, s: usize) -> (u64, u64, u64) {
        let w = &self.slices[s].words;
        (w.allowance_ns.load(Relaxed), w.consumed_ns.load(Relaxed), w.throttle_waits.load(Relaxed))
    }
}
