//! CPU cost of the memory audit's record sampler (`egpu_node::audit::ChargeSampler`).
//!
//! `cargo bench -p egpu-node --bench audit_sampler`
//!
//! - `reading/N`: one reading of one slice device's records with N
//!   attached processes (`UsageFile::used`), the unit the sampler repeats
//!   back to back while the driver's list is taken: the smaller it is, the
//!   shorter an allocate-and-free the sampler can miss.
//! - `window/two_readings` and `window/sampled`: the audit's fixed cost per
//!   device and second around a driver call that returns at once, for 8
//!   slices of 16 processes: two readings (before and after, the old rule)
//!   against the sampler (a reading, a thread started and joined, and the
//!   thread's readings).

use criterion::{Criterion, criterion_group, criterion_main};
use egpu_abi::UsageFile;
use egpu_node::audit::ChargeSampler;
use std::hint::black_box;
use std::sync::Arc;

fn slice(dir: &std::path::Path, name: &str, procs: u32) -> Arc<UsageFile> {
    let u = UsageFile::create(&dir.join(name), 1).expect("usage");
    for p in 0..procs {
        let slot = u.claim(1000 + p).expect("claim");
        u.try_charge(&slot, 0, 1 << 20, u64::MAX).expect("charge");
    }
    Arc::new(u)
}

fn reading(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    for n in [1u32, 16, egpu_abi::MAX_PROCS as u32] {
        let u = slice(dir.path(), &format!("u{n}"), n);
        c.bench_function(&format!("reading/{n}"), |b| b.iter(|| black_box(u.used(0))));
    }
}

fn window(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let files: Vec<(String, Arc<UsageFile>, Vec<usize>)> = (0..8).map(|i| (format!("s{i}"), slice(dir.path(), &format!("s{i}"), 16), vec![0])).collect();
    c.bench_function("window/two_readings", |b| {
        b.iter(|| {
            let before: u64 = files.iter().map(|(_, u, _)| u.used(0)).sum();
            let after: u64 = files.iter().map(|(_, u, _)| u.used(0)).sum();
            black_box((before, after))
        })
    });
    let sampler = ChargeSampler::new(files.clone());
    c.bench_function("window/sampled", |b| b.iter(|| black_box(sampler.during(|| ()))));
}

criterion_group!(benches, reading, window);
criterion_main!(benches);
