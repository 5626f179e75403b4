//! The fixed-fleet elastic strategy: no look-ahead, limits within each GPU,
//! and the fleet search; and the references that look ahead (hindsight,
//! foresight) against the re-planning that must not.

use clap::Parser;
use egpu_sim::elastic::{self, FleetConfig, Share};

const GIB: f64 = (1u64 << 30) as f64;

/// A pod: name, first minute, and (duty %, GiB) per minute.
type Pod<'a> = (&'a str, usize, Vec<(f64, f64)>);

/// Per-minute rows for the pods.
fn usage(rows: &[Pod]) -> elastic::Usage {
    let (mut d, mut m) = (Vec::new(), Vec::new());
    for (p, start, series) in rows {
        for (k, &(duty, gib)) in series.iter().enumerate() {
            let t = 60.0 * (start + k) as f64;
            d.push((p.to_string(), t, duty));
            m.push((p.to_string(), t, gib * GIB));
        }
    }
    elastic::load::align(&d, &m)
}

fn flat(minutes: usize, duty: f64, gib: f64) -> Vec<(f64, f64)> {
    vec![(duty, gib); minutes]
}

#[test]
fn a_jump_at_minute_t_is_a_violation_at_t() {
    // Three pods of 25 GiB share one 80 GiB GPU: 5 GiB spare, handed out
    // equally (limits 26.67 GiB). Pod a uses 29 GiB at minute 6 only. A
    // policy that saw minute 6 would have given a 29 GiB; decided from
    // minute 5 it cannot: 2.33 GiB are refused at minute 6, and nothing
    // else (at minute 7 a's base is 29, the others' limits 25.33).
    let mut a = flat(12, 10.0, 25.0);
    a[6].1 = 29.0;
    let u = usage(&[("a", 0, a), ("b", 0, flat(12, 10.0, 25.0)), ("c", 0, flat(12, 10.0, 25.0))]);
    let cfg = FleetConfig { mem_window: 1, share: Share::Equal, burst: false, ..Default::default() };
    let r = elastic::run_fleet(&u, 80.0, 1, 1, &cfg);
    let o = &r.outcome;
    assert_eq!((o.violation_minutes, o.mem_violation_minutes), (1, 1), "{o:?}");
    assert!((o.refused_mem_gib_minutes - (29.0 - 80.0 / 3.0)).abs() < 1e-6, "{o:?}");
    assert_eq!(o.pod_minutes, 36);
    // Resizing every 4 minutes (at 0, 4, 8): a's 29 GiB at minute 6 is
    // only seen at minute 8, by then it is back to 25.
    let r = elastic::run_fleet(&u, 80.0, 4, 1, &cfg);
    assert_eq!(r.outcome.violation_minutes, 1, "{:?}", r.outcome);
}

#[test]
fn a_burst_pool_serves_one_jump_and_refuses_coinciding_ones() {
    // Three pods of 25 GiB on one 80 GiB GPU: the base slices leave a
    // 5 GiB burst pool. a's jump to 29 GiB at minute 6 borrows 4 of it: no
    // violation (the split model above refuses 2.33 GiB of it).
    let mut a = flat(12, 10.0, 25.0);
    a[6].1 = 29.0;
    let cfg = FleetConfig { mem_window: 1, share: Share::Equal, burst: true, ..Default::default() };
    // (Resized every 4 minutes, so that the bases stay at 25 GiB: minute 6
    // alone is tested.)
    let u = usage(&[("a", 0, a.clone()), ("b", 0, flat(12, 10.0, 25.0)), ("c", 0, flat(12, 10.0, 25.0))]);
    let o = elastic::run_fleet(&u, 80.0, 4, 1, &cfg).outcome;
    assert_eq!(o.violation_minutes, 0, "{o:?}");
    // b jumps to 28 GiB in the same minute: 4 + 3 GiB borrowed from a
    // 5 GiB pool. Both borrowers count as refused, the 2 GiB excess split
    // between them by what they borrowed; c, at its base, does not.
    let mut b = flat(12, 10.0, 25.0);
    b[6].1 = 28.0;
    let u = usage(&[("a", 0, a), ("b", 0, b), ("c", 0, flat(12, 10.0, 25.0))]);
    let o = elastic::run_fleet(&u, 80.0, 4, 1, &cfg).outcome;
    assert_eq!((o.violation_minutes, o.mem_violation_minutes), (2, 2), "{o:?}");
    assert!((o.refused_mem_gib_minutes - 2.0).abs() < 1e-6, "{o:?}");
    assert!((o.max_refused_gib - 2.0 * 4.0 / 7.0).abs() < 1e-6, "{o:?}");
    // First come, first served: whichever of a and b comes first gets all
    // it borrows, the other what is left; one pod is refused, the same 2 GiB.
    let fc = elastic::run_fleet(&u, 80.0, 4, 1, &FleetConfig { first_come: true, ..cfg }).outcome;
    assert_eq!((fc.violation_minutes, fc.mem_violation_minutes), (1, 1), "{fc:?}");
    assert!((fc.refused_mem_gib_minutes - 2.0).abs() < 1e-6 && (fc.max_refused_gib - 2.0).abs() < 1e-6, "{fc:?}");
}

#[test]
fn first_come_order_is_not_the_pods_order() {
    // As above, a and b overflow the 5 GiB pool together, now in minutes
    // 6, 10, 14, … (between resizes, so their bases stay 25 GiB). One of
    // them is refused each time; an order that did not change with the
    // minute (pod order, say) would refuse the same one every time.
    let (mut a, mut b) = (flat(84, 10.0, 25.0), flat(84, 10.0, 25.0));
    for t in (6..84).step_by(4) {
        (a[t].1, b[t].1) = (29.0, 28.0);
    }
    let u = usage(&[("a", 0, a), ("b", 0, b), ("c", 0, flat(84, 10.0, 25.0))]);
    let cfg = FleetConfig { mem_window: 1, first_come: true, ..Default::default() };
    let o = elastic::run_fleet(&u, 80.0, 4, 1, &cfg).outcome;
    assert_eq!(o.mem_violation_minutes, 20, "one refusal in each of the 20 minutes: {o:?}");
    assert_eq!(o.pods_violated, 2, "both a and b are refused in some minute: {o:?}");
}

#[test]
fn first_come_refuses_the_same_memory_in_no_more_pods() {
    // Placement does not depend on how refusals are counted, so on any
    // trace the first-come count refuses the same GiB as counting every
    // borrower, spread over at most as many pod-minutes.
    let u = noisy(12, 80);
    let mut fewer = false;
    for n in [2, 3, 4] {
        let all = elastic::run_fleet(&u, 80.0, 1, n, &FleetConfig::default()).outcome;
        let fc = elastic::run_fleet(&u, 80.0, 1, n, &FleetConfig { first_come: true, ..Default::default() }).outcome;
        assert!(all.mem_violation_minutes > 0, "n={n}: the test needs overflowing pools: {all:?}");
        assert!(fc.mem_violation_minutes <= all.mem_violation_minutes, "n={n}: {} > {}", fc.mem_violation_minutes, all.mem_violation_minutes);
        assert!((fc.refused_mem_gib_minutes - all.refused_mem_gib_minutes).abs() <= 1e-6 * all.refused_mem_gib_minutes.max(1.0), "n={n}: {} vs {}", fc.refused_mem_gib_minutes, all.refused_mem_gib_minutes);
        assert_eq!(fc.migrations, all.migrations, "n={n}: same placement");
        fewer |= fc.mem_violation_minutes < all.mem_violation_minutes;
        // The default run also counts the same minutes first come, as the
        // estimate beside its bound; a first-come or split run does not.
        let run = elastic::run_fleet(&u, 80.0, 1, n, &FleetConfig::default());
        assert_eq!(run.first_come_violation_minutes, Some(fc.violation_minutes), "n={n}");
        assert_eq!(elastic::run_fleet(&u, 80.0, 1, n, &FleetConfig { first_come: true, ..Default::default() }).first_come_violation_minutes, None);
        assert_eq!(elastic::run_fleet(&u, 80.0, 1, n, &FleetConfig { burst: false, ..Default::default() }).first_come_violation_minutes, None);
    }
    assert!(fewer, "some overflowing minute had a borrower that fit when it came");
    // The search reports both counts at every size it tries, and the
    // first-come fleet is never larger.
    let cfg = FleetConfig { budget: 0.05, ..Default::default() };
    let (_, s) = elastic::search_fleet(&u, 80.0, 1, 1, 12, &cfg);
    assert_eq!(s.first_come_tried.len(), s.tried.len(), "{s:?}");
    assert!(s.tried.iter().zip(&s.first_come_tried).all(|(t, fc)| *fc <= t.1), "{s:?}");
    let fc_gpus = s.first_come_gpus.expect("the first-come count meets the budget no later");
    assert!(s.met && fc_gpus <= s.gpus, "{s:?}");
    assert_eq!(Some(fc_gpus), s.tried.iter().zip(&s.first_come_tried).find(|(_, fc)| **fc <= cfg.budget).map(|(t, _)| t.0), "{s:?}");
}

#[test]
fn compute_is_cut_only_beyond_the_fair_split() {
    // Three pods at 30% duty share one GPU: shares 30% each (their median),
    // plus a third each of the spare 10%. At minute 7 c idles, a wants 45%
    // and b 60%: 105% in all. Both are above their shares, but the arbiter
    // is work-conserving and weighted fair: c's unused share is split
    // between a and b, a's 45% fits its half, and only b is cut.
    let mut a = flat(12, 30.0, 1.0);
    let mut b = flat(12, 30.0, 1.0);
    let mut c = flat(12, 30.0, 1.0);
    (a[7].0, b[7].0, c[7].0) = (45.0, 60.0, 0.0);
    let u = usage(&[("a", 0, a), ("b", 0, b), ("c", 0, c)]);
    let cfg = FleetConfig { share: Share::Equal, ..Default::default() };
    let o = elastic::run_fleet(&u, 80.0, 1, 1, &cfg).outcome;
    assert_eq!((o.violation_minutes, o.mem_violation_minutes), (1, 0), "{o:?}");
}

#[test]
fn even_shares_cut_only_the_pods_above_the_common_level() {
    // One GPU, a steady at 50% duty, b and c at 5%. At minute 7 b and c
    // want 30% each: 110% in all. With even shares (a third each) the
    // arbiter's max-min split serves b and c in full and cuts a alone (to
    // 40%). With shares in proportion to the bases (a: 0.5 + 0.4 × 51/63,
    // b and c: 0.05 + 0.4 × 6/63) a is served in full and the 50% left is
    // split between b and c: both cut, two violations for the same minute.
    let mut b = flat(12, 5.0, 1.0);
    let mut c = flat(12, 5.0, 1.0);
    (b[7].0, c[7].0) = (30.0, 30.0);
    let u = usage(&[("a", 0, flat(12, 50.0, 1.0)), ("b", 0, b), ("c", 0, c)]);
    let cut = |share| {
        let r = elastic::run_fleet(&u, 80.0, 1, 1, &FleetConfig { share, ..Default::default() });
        assert_eq!((r.saturated_gpu_minutes, r.outcome.mem_violation_minutes), (1, 0), "{share:?}: {r:?}");
        assert!((r.max_gpu_shares - 1.0).abs() < 1e-9, "{share:?}: shares sum to the GPU: {r:?}");
        r.outcome.violation_minutes
    };
    assert_eq!(cut(Share::Even), 1);
    assert_eq!(cut(Share::Base), 2);
    assert_eq!(FleetConfig::default().share, Share::Even);
}

#[test]
fn unserved_work_waits_for_the_next_minute() {
    // One GPU, a steady at 50% duty, b at 10% but 70% at minute 6 and 40%
    // at minute 7. Minute 6: 120% in all, even shares cut b to 50% (0.2 of
    // its work left). Carried over, b asks 40% + 20% at minute 7: 110%,
    // cut again to 50% (0.1 left), and at minute 8 10% + 10% fits. Dropped,
    // minute 7 asks 90% and nobody is cut. Same placement, memory and
    // saturated GPU-minutes (summed duty above 100%: minute 6 only).
    let mut b = flat(12, 10.0, 1.0);
    (b[6].0, b[7].0) = (70.0, 40.0);
    let u = usage(&[("a", 0, flat(12, 50.0, 1.0)), ("b", 0, b)]);
    let run = |carry_unserved| elastic::run_fleet(&u, 80.0, 1, 1, &FleetConfig { carry_unserved, ..Default::default() });
    let (carry, drop) = (run(true), run(false));
    assert!(FleetConfig::default().carry_unserved);
    assert_eq!((carry.outcome.violation_minutes, drop.outcome.violation_minutes), (2, 1), "{carry:?}\n{drop:?}");
    assert_eq!((carry.saturated_gpu_minutes, carry.floor_pod_minutes), (1, 1), "{carry:?}");
    // The work left waiting at the end of each minute: 0.2 + 0.1, or 0.2.
    assert!((carry.outcome.short_gpu_minutes - 0.3).abs() < 1e-6 && (drop.outcome.short_gpu_minutes - 0.2).abs() < 1e-6, "{carry:?}\n{drop:?}");
    // What the pods asked of their own is the same: Σ duty, backlog not counted twice.
    assert!((carry.outcome.demand_gpu_minutes - drop.outcome.demand_gpu_minutes).abs() < 1e-9);
    // The cut pod got 0.5 of the 0.7 it asked at minute 6 (the lower
    // share of the two cuts) and 0.5 of 0.6 at minute 7.
    assert!((carry.outcome.cut_served_p10 - 0.5 / 0.7).abs() < 1e-6, "{carry:?}");
    // The per-pod strategies of the evaluation carry it too: both pods
    // share one GPU there as well (their slices fit), so the same two
    // cuts against one.
    let cfg = |carry_unserved| elastic::ElasticConfig { gpu_mem_gib: 80.0, carry_unserved, ..Default::default() };
    let (c, d) = (elastic::evaluate(&u, cfg(true)), elastic::evaluate(&u, cfg(false)));
    let cut = |e: &elastic::Evaluation, s: &str| e.outcomes.iter().find(|o| o.strategy == s).map(|o| o.violation_minutes);
    for s in ["elastic", "elastic-no-migration"] {
        assert_eq!((cut(&c, s), cut(&d, s)), (Some(2), Some(1)), "{s}");
    }
}

#[test]
fn carrying_unserved_work_never_hides_a_violation() {
    // Carrying only adds to what pods ask, and a max-min split of larger
    // asks cuts every pod it cut before: on the same placement, never fewer
    // violation pod-minutes, the same memory refusals and migrations, and
    // the same GPU-minutes whose own duty exceeds the GPU. On a fleet with
    // saturated minutes in a row it must add some.
    let u = noisy(12, 80);
    let mut added = 0;
    for share in [Share::Even, Share::Equal, Share::Reach] {
        for n in [1, 2, 3, 4, 6] {
            let cfg = FleetConfig { share, ..Default::default() };
            let carry = elastic::run_fleet(&u, 80.0, 1, n, &FleetConfig { carry_unserved: true, ..cfg });
            let drop = elastic::run_fleet(&u, 80.0, 1, n, &FleetConfig { carry_unserved: false, ..cfg });
            let (c, d) = (&carry.outcome, &drop.outcome);
            assert!(c.violation_minutes >= d.violation_minutes, "{share:?} n={n}: {c:?}\n{d:?}");
            assert_eq!((c.mem_violation_minutes, c.migrations, carry.saturated_gpu_minutes), (d.mem_violation_minutes, d.migrations, drop.saturated_gpu_minutes), "{share:?} n={n}");
            added += c.violation_minutes - d.violation_minutes;
        }
    }
    assert!(added > 0, "no saturated minute in a row on the noisy trace");
    // Every strategy of the evaluation: never fewer; exclusive and static
    // peak slices never saturate a GPU, so nothing waits there.
    let cfg = |carry_unserved| elastic::ElasticConfig { gpu_mem_gib: 80.0, fleet: Some(FleetConfig { gpus: Some(2), ..Default::default() }), carry_unserved, ..Default::default() };
    let (carry, drop) = (elastic::evaluate(&u, cfg(true)), elastic::evaluate(&u, cfg(false)));
    for (c, d) in carry.outcomes.iter().zip(&drop.outcomes) {
        assert_eq!(c.strategy, d.strategy);
        assert!(c.violation_minutes >= d.violation_minutes, "{c:?}\n{d:?}");
        if c.strategy == "exclusive" || c.strategy == "static-peak" {
            assert_eq!(c.violation_minutes, 0, "{c:?}");
        }
    }
    // The evaluation's setting governs the fleet's.
    let fleet = |e: &elastic::Evaluation| e.outcomes.iter().find(|o| o.strategy == "elastic-fleet").map(|o| o.violation_minutes);
    assert_eq!(fleet(&drop), Some(elastic::run_fleet(&u, 80.0, 1, 2, &FleetConfig { carry_unserved: false, ..Default::default() }).outcome.violation_minutes));
}

/// A deterministic noisy trace: `pods` pods with staggered lives.
fn noisy(pods: usize, minutes: usize) -> elastic::Usage {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 11) as f64 / (1u64 << 53) as f64
    };
    let names: Vec<String> = (0..pods).map(|i| format!("p{i}")).collect();
    let mut rows = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let start = (i * 7) % 20;
        let len = minutes - start - (i * 3) % 15;
        let level = 10.0 + 25.0 * rnd();
        let series: Vec<(f64, f64)> = (0..len).map(|_| (100.0 * rnd().powi(3), (level + 12.0 * (rnd() - 0.3)).max(0.5))).collect();
        rows.push((name.as_str(), start, series));
    }
    usage(&rows)
}

#[test]
fn limits_on_a_gpu_never_exceed_it_and_no_pod_is_dropped() {
    let u = noisy(12, 80);
    let live: u64 = (0..u.pods.len()).map(|i| (0..u.minutes).filter(|&t| !u.mem[i][t].is_nan()).count() as u64).sum();
    for (share, burst, first_come) in [Share::Even, Share::Equal, Share::Base, Share::Volatility, Share::Reach].into_iter().flat_map(|s| [(s, false, false), (s, true, false), (s, true, true)]) {
        for n in [1, 2, 3, 4, 6, 12] {
            let cfg = FleetConfig { share, burst, first_come, risk_window: 10, risk_moves: 1, rebalance: 1, min_spare_gib: 30.0, ..Default::default() };
            let r = elastic::run_fleet(&u, 80.0, 1, n, &cfg);
            assert!(r.max_gpu_mem_limits_gib <= 80.0 + 1e-6, "{share:?} n={n}: Σ memory limits {}", r.max_gpu_mem_limits_gib);
            assert!(r.max_gpu_shares <= 1.0 + 1e-9, "{share:?} n={n}: Σ shares {}", r.max_gpu_shares);
            assert_eq!(r.outcome.pod_minutes, live, "every live pod-minute is counted");
            assert_eq!(r.outcome.gpus, n);
            if n == 1 {
                // 12 pods of 10–35 GiB cannot fit one GPU: limits are scaled
                // down, the pods stay, and their misses are counted.
                assert!(r.overflow_minutes > 0 && r.outcome.mem_violation_minutes > 0, "{r:?}");
            }
            if n == 12 && !burst {
                // Spare capacity is handed out in full (a burst pool lends
                // only what is used).
                assert!(r.max_gpu_mem_limits_gib > 80.0 - 1e-6, "{share:?}: {}", r.max_gpu_mem_limits_gib);
            }
        }
    }
}

#[test]
fn planned_and_re_planned_fleets_keep_the_limits_and_every_pod() {
    let u = noisy(12, 80);
    let live: u64 = (0..u.pods.len()).map(|i| (0..u.minutes).filter(|&t| !u.mem[i][t].is_nan()).count() as u64).sum();
    for n in [1, 2, 3, 6, 12] {
        let mut runs = Vec::new();
        for (window, shuffled) in [(1, None), (7, None), (7, Some(1)), (7, Some(3)), (u.minutes, None)] {
            let (r, plan) = elastic::run_fleet_foresight(&u, 80.0, 1, n, &FleetConfig::default(), window, shuffled);
            assert_eq!(plan.len(), u.minutes.div_ceil(window), "one placement a window");
            assert!(plan.iter().flatten().all(|&g| g < n), "n={n} window={window}: {plan:?}");
            // A migration is a live pod that changes GPU between windows.
            let alive = |i: usize, t: usize| !u.mem[i][t].is_nan();
            let moves: u64 = (1..plan.len()).map(|k| (0..u.pods.len()).filter(|&i| alive(i, k * window - 1) && alive(i, k * window) && plan[k][i] != plan[k - 1][i]).count() as u64).sum();
            assert_eq!(r.outcome.migrations, moves, "n={n} window={window}");
            runs.push(r);
        }
        for replan in [1, 5] {
            runs.push(elastic::run_fleet(&u, 80.0, 1, n, &FleetConfig { replan, replan_lookback: 10, ..Default::default() }));
        }
        for r in runs {
            assert!(r.max_gpu_mem_limits_gib <= 80.0 + 1e-6 && r.max_gpu_shares <= 1.0 + 1e-9, "n={n}: {r:?}");
            assert_eq!((r.outcome.pod_minutes, r.outcome.gpus), (live, n), "every live pod-minute is counted");
        }
    }
}

#[test]
fn search_returns_the_smallest_fleet_within_budget() {
    // Five steady pods of 30 GiB, 80 GiB GPUs: two GPUs must hold three
    // pods on one (90 GiB > 80, every minute a violation), three GPUs hold
    // them all. So the smallest fleet within 1% is 3, and 1 and 2 are
    // tried first and fail.
    let rows: Vec<(String, Vec<(f64, f64)>)> = (0..5).map(|i| (format!("p{i}"), flat(30, 5.0, 30.0))).collect();
    let u = usage(&rows.iter().map(|(n, s)| (n.as_str(), 0, s.clone())).collect::<Vec<_>>());
    let cfg = FleetConfig::default();
    let (r, s) = elastic::search_fleet(&u, 80.0, 1, 1, 5, &cfg);
    assert_eq!((s.gpus, s.met), (3, true), "{s:?}");
    assert_eq!(s.tried.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert!(s.tried[..2].iter().all(|t| t.1 > cfg.budget), "{s:?}");
    assert_eq!(r.outcome.violation_minutes, 0);
    let two = elastic::run_fleet(&u, 80.0, 1, 2, &cfg);
    assert!(two.outcome.violation_minutes >= 30, "{:?}", two.outcome);
    // A budget nothing meets: the cap is returned, marked as missed.
    let (_, s) = elastic::search_fleet(&u, 80.0, 1, 1, 2, &cfg);
    assert_eq!((s.gpus, s.met), (2, false));
    // Through evaluate: the search starts at the lower bound (ceil(150/80) = 2).
    let e = elastic::evaluate(&u, elastic::ElasticConfig { gpu_mem_gib: 80.0, fleet: Some(cfg), ..Default::default() });
    assert_eq!(e.lower_bound, 2);
    let f = e.fleet.as_ref().expect("fleet evaluated");
    assert_eq!((f.gpus, f.tried.len()), (3, 2));
    let o = e.outcomes.iter().find(|o| o.strategy == "elastic-fleet").expect("fleet row");
    assert_eq!((o.gpus, o.violation_minutes), (3, 0));
    assert!(o.saving_vs_exclusive > 1.6, "{o:?}");
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: egpu_sim::cli::SimulateArgs,
}

#[test]
fn fleet_flags_are_validated() {
    let parse = |extra: &[&str]| Cli::try_parse_from(["simulate", "--elastic"].iter().chain(extra)).map(|c| c.args);
    let ok = parse(&["--fleet-budget", "0.005", "--fleet-share", "equal", "--fleet-gpus", "40"]).expect("valid flags");
    assert_eq!((ok.fleet_budget, ok.fleet_share.as_str(), ok.fleet_gpus), (0.005, "equal", Some(40)));
    let ok = parse(&["--fleet-memory", "burst-first-come"]).expect("valid flags");
    assert_eq!((ok.fleet_memory.as_str(), ok.fleet_share.as_str(), ok.unserved_compute.as_str()), ("burst-first-come", "even", "carry"));
    assert_eq!(parse(&["--unserved-compute", "drop"]).expect("valid flags").unserved_compute, "drop");
    for bad in [["--fleet-memory", "first-come"], ["--unserved-compute", "lose"], ["--fleet-budget", "2"], ["--fleet-budget", "nan"], ["--fleet-share", "random"], ["--fleet-gpus", "0"], ["--fleet-mem-window", "0"], ["--fleet-compute-quantile", "0"], ["--fleet-mem-headroom", "-0.1"]] {
        let err = parse(&bad).err().unwrap_or_else(|| panic!("{bad:?} accepted"));
        assert!(err.to_string().contains(bad[0]), "{bad:?}: {err}");
    }
}

#[test]
fn hindsight_placement_keeps_coinciding_bursts_apart_and_never_moves_a_pod() {
    // Two GPUs of 80 GiB. x and y (40 GiB, idle) fill GPU 0 exactly, so a
    // greedy first pass puts a and b (30 GiB, both 70% busy in minutes
    // 0–9) together on GPU 1: saturated for 10 minutes. No single move
    // helps (either GPU would then hold 100 GiB); swapping x with a does.
    let busy = |minutes: usize| -> Vec<(f64, f64)> { (0..20).map(|t| (if t < minutes { 70.0 } else { 0.0 }, 30.0)).collect() };
    let u = usage(&[("x", 0, flat(20, 0.0, 40.0)), ("y", 0, flat(20, 0.0, 40.0)), ("a", 0, busy(10)), ("b", 0, busy(10))]);
    let cfg = FleetConfig::default();
    let (r, at) = elastic::run_fleet_hindsight(&u, 80.0, 1, 2, &cfg);
    let gpu = |name: &str| at[u.pods.iter().position(|p| p == name).unwrap()];
    assert_ne!(gpu("a"), gpu("b"), "{at:?}");
    assert_ne!(gpu("x"), gpu("y"), "{at:?}");
    assert!(at.iter().all(|&g| g < 2), "{at:?}");
    assert_eq!(r.saturated_gpu_minutes, 0, "{:?}", r.outcome);
    assert_eq!((r.outcome.violation_minutes, r.outcome.migrations), (0, 0), "{:?}", r.outcome);
    assert_eq!(r.outcome.strategy, "fleet-hindsight-static");
}

#[test]
fn severity_says_how_much_time_the_cuts_cost_and_what_no_split_could_avoid() {
    // One GPU, two pods of 10 GiB at 10% duty for an hour; equal shares
    // (bases 0.1, spare split: 0.5 each). Minute 6: both ask 60%, the fair
    // split gives each 50% (two cuts, 0.2 GPU-minutes short), though one
    // cut would have been enough. Minute 8: a asks 95%, b 10%: b is served
    // in full, a gets 90% (one cut, 0.05 short). Pod c lives two minutes
    // (30, 31), idle then 95%: at 31 its share is 0.267 + what a and b
    // leave, 0.8 (one cut, 0.15 short), and it jumps from 10 to 75 GiB,
    // 15 more than the 50 GiB burst pool: refused memory too, still one
    // violation minute, and still one for the floor.
    let mut a = flat(60, 10.0, 10.0);
    let mut b = flat(60, 10.0, 10.0);
    a[6].0 = 60.0;
    b[6].0 = 60.0;
    a[8].0 = 95.0;
    let u = usage(&[("a", 0, a), ("b", 0, b), ("c", 30, vec![(0.0, 10.0), (95.0, 75.0)])]);
    let cfg = FleetConfig { share: Share::Equal, ..Default::default() };
    let r = elastic::run_fleet(&u, 80.0, 1, 1, &cfg);
    let o = &r.outcome;
    assert_eq!((o.violation_minutes, o.mem_violation_minutes, r.saturated_gpu_minutes, r.floor_pod_minutes), (4, 1, 3, 3), "{r:?}");
    assert!((o.refused_mem_gib_minutes - 15.0).abs() < 1e-6, "{o:?}");
    // (The trace keeps duty as f32.)
    assert!((o.short_gpu_minutes - 0.4).abs() < 1e-6, "{o:?}");
    assert!((o.demand_gpu_minutes - (12.0 + 1.0 + 0.85 + 0.95)).abs() < 1e-5, "{o:?}");
    assert!((o.cut_served_p50 - 0.5 / 0.6).abs() < 1e-6 && (o.cut_served_p10 - 0.5 / 0.6).abs() < 1e-6, "{o:?}");
    // Three pods had a violation; c's 1 in 2 minutes is left out of the
    // per-pod fractions (it did not live an hour): a's 2 of 60 is the worst.
    assert_eq!(o.pods_violated, 3);
    assert!((o.pod_violation_max.unwrap() - 2.0 / 60.0).abs() < 1e-9 && (o.pod_violation_p90.unwrap() - 2.0 / 60.0).abs() < 1e-9, "{o:?}");
    // Where no pod lived an hour there is no per-pod fraction to give:
    // none, not 0% (c alone, with its violation minute).
    let short = elastic::run_fleet(&usage(&[("c", 0, vec![(0.0, 10.0), (95.0, 95.0)])]), 80.0, 1, 1, &cfg).outcome;
    assert!(short.pods_violated == 1 && short.pod_violation_max.is_none() && short.pod_violation_p90.is_none(), "{short:?}");
    assert!(serde_json::to_string(&short).unwrap().contains(r#""pod_violation_max":null"#));
    // The search reports the floor of every size it tried.
    let (_, s) = elastic::search_fleet(&u, 80.0, 1, 1, 2, &cfg);
    assert_eq!(s.floors.len(), s.tried.len());
    assert!((s.floors[0] - 3.0 / 122.0).abs() < 1e-9, "{s:?}");
}

#[test]
fn the_evaluation_says_each_strategy_and_each_fleet_size_it_tries() {
    let u = noisy(12, 80);
    let cfg = elastic::ElasticConfig { gpu_mem_gib: 80.0, fleet: Some(FleetConfig { hindsight: true, foresight: Some(5), ..Default::default() }), ..Default::default() };
    let notes = std::cell::RefCell::new(Vec::<String>::new());
    let e = elastic::evaluate_with(&u, cfg, &|s| notes.borrow_mut().push(s.to_string()));
    let notes = notes.into_inner();
    assert!(e.fleet.as_ref().unwrap().tried.len() >= 2, "the search tries more than one size here");
    for s in ["80 GiB: exclusive and static-peak", "80 GiB: elastic and elastic-no-migration", "80 GiB: oracle-next-period"] {
        assert!(notes.iter().any(|n| n == s), "{s} not said: {notes:?}");
    }
    for (name, search) in [("elastic-fleet", e.fleet.as_ref().unwrap()), ("fleet-hindsight-static", e.hindsight.as_ref().unwrap()), ("fleet-foresight", e.foresight.as_ref().unwrap())] {
        assert!(e.outcomes.iter().any(|o| o.strategy == name), "{name} has an outcome");
        let said: Vec<&String> = notes.iter().filter(|n| n.starts_with(&format!("{name}: "))).collect();
        assert_eq!(said.len(), search.tried.len(), "{name}: {notes:?}");
        for (note, (n, _)) in said.iter().zip(&search.tried) {
            assert!(note.starts_with(&format!("{name}: {n} GPUs of 80 GiB")), "{note}");
        }
        // From the second size on, the line says what the one before gave.
        if let (Some(second), Some(&(first, v))) = (said.get(1), search.tried.first()) {
            assert!(second.contains(&format!("({first}: {:.3}% violations", 100.0 * v)), "{second}");
        }
    }
    // The plain evaluation gives the same result.
    assert_eq!(elastic::evaluate(&u, cfg).fleet.unwrap().tried, e.fleet.unwrap().tried);
}

/// Four pods of 30 GiB at 5% duty, two to an 80 GiB GPU, over `minutes`;
/// `burst(pod, minute)` says when a pod runs at 70% instead.
fn pairs(minutes: usize, burst: impl Fn(&str, usize) -> bool) -> elastic::Usage {
    let pod = |name: &'static str| (name, 0, (0..minutes).map(|t| (if burst(name, t) { 70.0 } else { 5.0 }, 30.0)).collect());
    usage(&[pod("a"), pod("b"), pod("c"), pod("d")])
}

#[test]
fn foresight_re_places_pods_for_each_window_and_hindsight_cannot() {
    // a bursts with b in minutes 0–9, with c in 10–19, with d in 20–29.
    // Never moved, a shares a GPU with one of them: 10 saturated minutes
    // at best. Re-placed every 10 minutes knowing the next 10, a is apart
    // from its partner of the window every time, at two moves a window.
    let partner = |t: usize| ["b", "c", "d"][t / 10];
    let u = pairs(30, |p, t| p == "a" || p == partner(t));
    let cfg = FleetConfig::default();
    let (r, plan) = elastic::run_fleet_foresight(&u, 80.0, 1, 2, &cfg, 10, None);
    let at = |k: usize, name: &str| plan[k][u.pods.iter().position(|p| p == name).unwrap()];
    assert_eq!(plan.len(), 3);
    for (k, p) in ["b", "c", "d"].iter().enumerate() {
        assert_ne!(at(k, "a"), at(k, p), "window {k}: {plan:?}");
    }
    assert_eq!((r.saturated_gpu_minutes, r.outcome.violation_minutes, r.outcome.migrations), (0, 0, 4), "{r:?}");
    assert_eq!(r.outcome.strategy, "fleet-foresight");
    let (h, _) = elastic::run_fleet_hindsight(&u, 80.0, 1, 2, &cfg);
    assert_eq!((h.saturated_gpu_minutes, h.outcome.migrations), (10, 0), "{h:?}");
    // Each burst fills its window, so its levels alone say as much as its
    // timing: with the samples shuffled inside each window, the same.
    let (s, _) = elastic::run_fleet_foresight(&u, 80.0, 1, 2, &cfg, 10, Some(1));
    assert_eq!((s.saturated_gpu_minutes, s.outcome.migrations, s.outcome.strategy.as_str()), (0, 4, "fleet-foresight-shuffled"), "{s:?}");
    // A window of the whole trace is the hindsight placement.
    let (w, plan) = elastic::run_fleet_foresight(&u, 80.0, 1, 2, &cfg, 30, None);
    assert_eq!((plan.len(), w.saturated_gpu_minutes, w.outcome.migrations), (1, 10, 0), "{w:?}");
    assert_eq!(plan[0], elastic::run_fleet_hindsight(&u, 80.0, 1, 2, &cfg).1);
}

#[test]
fn shuffled_foresight_plans_for_the_levels_not_for_one_draw() {
    // a and b each burst in 2 of every 10 minutes, never together; c and d
    // never burst. Shuffled, a and b meet in a window of a draw with
    // probability 1 − C(8,2)/C(10,2) = 38%. Pairing them costs nothing in a
    // draw where they miss each other, so a plan against one draw pairs
    // them where its first window's draw has them miss (the planner's ties
    // go to the lower GPU), and a
    // plan against 32 draws does not (all 32 miss: (28/45)^32, about 2.5e-7).
    // Apart (a or b with c or d) nothing saturates.
    let mut paired_by_one = 0;
    for shift in 0..10 {
        let u = pairs(40, |p, t| match p {
            "a" => (t + shift) % 10 < 2,
            "b" => (t + shift) % 10 >= 5 && (t + shift) % 10 < 7,
            _ => false,
        });
        let (a, b) = (u.pods.iter().position(|p| p == "a").unwrap(), u.pods.iter().position(|p| p == "b").unwrap());
        let (_, one) = elastic::run_fleet_foresight(&u, 80.0, 1, 2, &FleetConfig::default(), 10, Some(1));
        paired_by_one += one.iter().filter(|w| w[a] == w[b]).count();
        let (r, many) = elastic::run_fleet_foresight(&u, 80.0, 1, 2, &FleetConfig::default(), 10, Some(32));
        assert!(many.iter().all(|w| w[a] != w[b]), "shift {shift}: {many:?}");
        // Apart, their bursts never saturate a GPU.
        assert_eq!((r.saturated_gpu_minutes, r.outcome.violation_minutes), (0, 0), "shift {shift}: {r:?}");
    }
    assert!(paired_by_one > 0, "one draw always kept a and b apart: the test shows nothing");
}

#[test]
fn re_planning_learns_from_the_past_only() {
    // The fleet puts a and c on GPU 0 (most room first: a, b, c, d go to
    // GPUs 0, 1, 0, 1). They burst together every fourth minute: without
    // re-planning, 15 saturated minutes; re-planned every 10 minutes on the
    // last 10, they are apart from minute 10 on (bursts at 1, 5, 9 only).
    let u = pairs(60, |p, t| (p == "a" || p == "c") && t % 4 == 1);
    let plain = elastic::run_fleet(&u, 80.0, 1, 2, &FleetConfig::default());
    assert_eq!((plain.saturated_gpu_minutes, plain.outcome.migrations), (15, 0), "{plain:?}");
    let cfg = FleetConfig { replan: 10, replan_lookback: 10, ..Default::default() };
    let r = elastic::run_fleet(&u, 80.0, 1, 2, &cfg);
    assert_eq!(r.saturated_gpu_minutes, 3, "{r:?}");
    assert!(r.outcome.migrations >= 1, "{r:?}");
    // Bursts that start only after a re-plan (minutes 10–19) are not
    // seen by it: they saturate until the next one, at 20, which no
    // longer helps. Knowing the coming 10 minutes avoids them all.
    let u = pairs(30, |p, t| (p == "a" || p == "c") && (10..20).contains(&t));
    assert_eq!(elastic::run_fleet(&u, 80.0, 1, 2, &cfg).saturated_gpu_minutes, 10);
    assert_eq!(elastic::run_fleet_foresight(&u, 80.0, 1, 2, &FleetConfig::default(), 10, None).0.saturated_gpu_minutes, 0);
}
