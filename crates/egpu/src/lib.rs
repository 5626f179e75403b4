//! The `egpu` CLI and the `egpud` flags, as a library so the binaries stay thin.
//!
//! Contract: every command talks to `egpud` over its gRPC unix socket
//! (`--socket` / `EGPU_SOCKET`); nothing here touches slice files directly,
//! except `egpu run`/`exec`, which only apply the environment `egpud`
//! returns. Exit codes are in [`exit`].

/// `println!` for the progress text of `demo` and `bench`: a reader that
/// went away (`egpu demo | head`) is no panic, and the command still runs
/// to its end and cleans up.
macro_rules! say {
    ($($t:tt)*) => {
        let _ = $crate::output::print(&format!("{}\n", format_args!($($t)*)));
    };
}

pub mod bench;
pub mod cli;
pub mod cmd;
pub mod daemon;
pub mod demo;
pub mod exit;
pub mod localnode;
pub mod output;
pub mod process;
pub mod top;
