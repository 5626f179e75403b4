//! `egpu bench` (being built).

#[derive(Debug, clap::Args)]
pub struct ResizeBenchArgs {}

pub async fn resize(_socket: &std::path::Path, _args: ResizeBenchArgs) -> anyhow::Result<i32> {
    anyhow::bail!("not built yet")
}
