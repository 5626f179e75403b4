//! Runs `egpu simulate` until the `egpu` binary wires it:
//! `cargo run --release -p egpu-sim --example simulate -- [FLAGS]`.
//! Exits as `egpu` does: 2 for a usage error, 1 for any other failure.
use clap::Parser;
use std::process::ExitCode;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: egpu_sim::cli::SimulateArgs,
}

fn main() -> ExitCode {
    match egpu_sim::cli::run(Cli::parse().args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("simulate: {e:#}");
            ExitCode::from(if e.downcast_ref::<egpu_sim::cli::UsageError>().is_some() { 2 } else { 1 })
        }
    }
}
