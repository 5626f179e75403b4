//! `egpu`: the command-line interface (placeholder while the CLI is built).
fn main() {}
