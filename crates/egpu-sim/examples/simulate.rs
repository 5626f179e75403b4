//! Runs `egpu simulate` until the `egpu` binary wires it:
//! `cargo run --release -p egpu-sim --example simulate -- [FLAGS]`.
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: egpu_sim::cli::SimulateArgs,
}

fn main() -> anyhow::Result<()> {
    egpu_sim::cli::run(Cli::parse().args)
}
