//! `egpu-cdi-hook`: the `createContainer` hook of every slice's CDI spec.
//! It reads the OCI state on stdin and refuses (exit 1, the reason on
//! stderr) a container whose image cannot load `libegpu.so`, which would
//! otherwise run unlimited. Logic in the library of this crate.

use clap::Parser;
use egpu_cdi_hook::{check_rootfs, rootfs_of_state};
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(name = "egpu-cdi-hook", version, about = "OCI hook run by a slice's CDI spec: refuses a container whose image cannot load libegpu.so (reads the OCI state on stdin)")]
struct Args {
    /// The interposer the container's /etc/ld.so.preload names (its host path).
    #[arg(long)]
    hook_lib: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut state = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut state) {
        eprintln!("egpu-cdi-hook: cannot read the OCI state on stdin: {e}");
        return ExitCode::FAILURE;
    }
    match rootfs_of_state(&state).and_then(|root| check_rootfs(&root, &args.hook_lib)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let mut msg = e.to_string();
            let mut cur = std::error::Error::source(&e);
            while let Some(c) = cur {
                msg.push_str(&format!(": {c}"));
                cur = c.source();
            }
            eprintln!("egpu: this container cannot be held to its GPU slice, so it is not started: {msg}");
            ExitCode::FAILURE
        }
    }
}
