//! `egpu top --once` against a simulated egpud: both slices with their
//! memory limits and compute share/limit, the device's reserved shares, and a
//! clean failure when egpud is not there.

mod common;
use common::*;

#[test]
fn top_once_shows_slices_with_limits_and_shares() {
    let node = Node::start("1x16GiB");
    node.ok(&["create", "--name", "alpha", "--gpu-memory", "2GiB", "--gpu-compute", "30%", "--gpu-compute-limit", "30%", "--priority", "high"]);
    node.ok(&["create", "--name", "beta", "--gpu-memory", "1GiB", "--gpu-compute", "70%"]);
    let out = node.ok(&["top", "--once"]);
    let line = |needle: &str| out.lines().find(|l| l.contains(needle)).unwrap_or_else(|| panic!("no line with {needle:?}:\n{out}")).to_string();
    let alpha = line("alpha");
    for want in ["0B/2GiB", "30%/30%", "high"] {
        assert!(alpha.contains(want), "alpha row lacks {want:?}: {alpha}\n{out}");
    }
    let beta = line("beta");
    for want in ["0B/1GiB", "70%/100%", "normal"] {
        assert!(beta.contains(want), "beta row lacks {want:?}: {beta}\n{out}");
    }
    // The device row: 3GiB reserved by slices, 100% of compute shares.
    let dev = line("/16GiB");
    assert!(dev.contains("3GiB") && dev.contains("100%"), "device row: {dev}\n{out}");
    assert!(out.contains("2 slice(s)"), "{out}");
    // Plain text for scripts: no escape sequences.
    assert!(!out.contains('\x1b'), "escape sequences in --once output: {out:?}");

    // After a resize the next frame shows the new limits.
    node.ok(&["resize", "beta", "--gpu-compute", "40%", "--gpu-memory", "3GiB"]);
    let out = node.ok(&["top", "--once"]);
    let beta = out.lines().find(|l| l.contains("beta")).unwrap();
    assert!(beta.contains("0B/3GiB") && beta.contains("40%/100%"), "{beta}\n{out}");
}

#[test]
fn top_without_egpud_fails_with_exit_5() {
    let dir = tempfile::tempdir().unwrap();
    let o = std::process::Command::new(EGPU).args(["top", "--once"]).env("EGPU_SOCKET", dir.path().join("none.sock")).output().unwrap();
    assert_fails(&o, 5, &["cannot reach egpud"]);
}

#[test]
fn a_frame_too_narrow_to_show_anything_is_refused() {
    for w in ["0", "39"] {
        let o = std::process::Command::new(EGPU).args(["top", "--once", "--width", w]).env("EGPU_SOCKET", "/nonexistent/egpud.sock").output().unwrap();
        assert_fails(&o, 2, &["--width", "40..=1000"]);
    }
}
