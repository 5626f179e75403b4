//! `egpu`: the eGPU command-line interface (logic in the `egpu_cli` library).

use clap::Parser;
use egpu_cli::cli::Cli;

fn main() {
    let cli = Cli::parse();
    if let egpu_cli::cli::Command::ExecGate { fd, cmd } = &cli.command {
        std::process::exit(egpu_cli::process::exec_gate(*fd, cmd));
    }
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("egpu: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = match rt.block_on(egpu_cli::cmd::run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("egpu: {e:#}");
            egpu_cli::exit::code_of(&e)
        }
    };
    rt.shutdown_background();
    std::process::exit(code);
}
