//! `egpu demo` (being built).

#[derive(Debug, clap::Args)]
pub struct DemoArgs {}

pub async fn run(_args: DemoArgs) -> anyhow::Result<i32> {
    anyhow::bail!("the demo is not built yet")
}
