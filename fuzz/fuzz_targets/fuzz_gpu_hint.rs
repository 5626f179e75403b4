//! `RUSTC_BOOTSTRAP=1 cargo fuzz run fuzz_gpu_hint`: the pod annotation
//! `egpu.io/gpu-hint` is written by anyone who may annotate a pod, and read
//! by the device plugin at admission. Any text must parse or be refused
//! without panicking; what parses must read back the same once written;
//! and the plugin's choice from it must give exactly the size asked, all
//! from the available units of the hinted GPU, or fall back.
#![no_main]
use egpu_k8s::hint::{Choice, Hint, choose, pending};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    // The first line is the annotation; the rest name available units, one
    // device ID per line, and the last byte the size asked.
    let (value, rest) = text.split_once('\n').unwrap_or((text, ""));
    let Ok(hint) = Hint::parse(value) else { return };
    assert_eq!(Hint::parse(&hint.to_annotation()), Ok(hint.clone()));
    let available: Vec<String> = rest.lines().map(str::to_string).collect();
    let size = usize::from(data.last().copied().unwrap_or(0) % 32);
    let (p, _) = pending([("pod".to_string(), value, 0)], &Default::default(), hint.at);
    match choose(&available, &[], size, &p) {
        Choice::Followed { key, ids } => {
            assert_eq!(ids.len(), size);
            let uuid = &p.iter().find(|e| e.key == key).expect("a pending entry").uuid;
            for id in &ids {
                assert!(available.contains(id));
                assert_eq!(egpu_k8s::tokens::parse_token(id).map(|(u, _)| u), Some(uuid.as_str()));
            }
        }
        Choice::Stale | Choice::None => {}
    }
});
