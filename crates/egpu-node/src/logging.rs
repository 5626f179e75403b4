//! The daemons' one logging set-up (egpud, egpu-device-plugin,
//! egpu-scheduler): stderr, in colour on a terminal, with a filter checked
//! when the flag is read.

/// Logs to stderr with `filter` (checked by [`log_filter`]). A log line
/// that cannot be written (stderr a pipe whose reader went away) is
/// dropped: tracing's default reports the failed write with `eprintln!`,
/// which panics on that same stderr and would take the daemon down.
pub fn init_logging(filter: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .log_internal_errors(false)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// `--log`: refused when tracing cannot parse it, rather than silently
/// logging at another level than the one asked for.
pub fn log_filter(s: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::try_new(s)
        .map(|_| s.to_string())
        .map_err(|e| format!("{e}: give a level (error, warn, info, debug, trace) or directives such as info,egpu_node=debug"))
}
