//! Exit codes of `egpu`, and the mapping from errors to them.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success |
//! | 1 | other failure |
//! | 2 | usage error: bad flag or value (also a request egpud calls invalid) |
//! | 3 | not found: unknown slice or device |
//! | 4 | rejected: would overcommit a device, name taken, slice busy |
//! | 5 | cannot reach egpud, it did not answer within 30 s, or its connection broke off mid-request |
//!
//! `egpu run` and `egpu exec` exit with the program's status instead
//! (128 + N when it was killed by signal N; 127 when it could not be started).

use tonic::Code;

pub const FAILURE: i32 = 1;
pub const USAGE: i32 = 2;
pub const NOT_FOUND: i32 = 3;
pub const REJECTED: i32 = 4;
pub const UNREACHABLE: i32 = 5;
pub const CANNOT_START: i32 = 127;

/// An error that carries its exit code.
#[derive(Debug)]
pub struct Failure {
    pub code: i32,
    pub message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

impl Failure {
    pub fn new(code: i32, message: impl Into<String>) -> Failure {
        Failure { code, message: message.into() }
    }
}

/// Exit code of a gRPC status from egpud.
pub fn code_of_status(s: &tonic::Status) -> i32 {
    match s.code() {
        Code::InvalidArgument | Code::OutOfRange => USAGE,
        Code::NotFound => NOT_FOUND,
        Code::ResourceExhausted | Code::AlreadyExists | Code::FailedPrecondition => REJECTED,
        Code::Unavailable => UNREACHABLE,
        _ if timed_out(s) || broke_off(s) => UNREACHABLE,
        _ => FAILURE,
    }
}

/// Whether the connection broke off before egpud answered (it exited or
/// was killed mid-request). tonic reports a broken stream as an unknown
/// "transport error", a request still queued as hyper's "operation was
/// canceled", an HTTP/2 reset as an "h2 protocol error", a body cut short
/// as an "error reading a body from connection", and an answer without its
/// status as a "missing grpc-status trailer". egpud's own answers never
/// use the codes Unknown or Cancelled, nor these words.
fn broke_off(s: &tonic::Status) -> bool {
    let m = s.message().to_ascii_lowercase();
    let words = ["transport error", "operation was canceled", "h2 protocol error", "error reading a body from connection", "missing grpc-status trailer"];
    matches!(s.code(), Code::Unknown | Code::Cancelled | Code::Internal) && words.iter().any(|w| m.contains(w))
}

/// Whether the request ran past the client's timeout
/// ([`egpu_node::client::REQUEST_TIMEOUT`]): egpud accepted it but never answered.
fn timed_out(s: &tonic::Status) -> bool {
    s.code() == Code::Cancelled && s.message().to_ascii_lowercase().contains("timeout")
}

/// Turns an egpud status into an error with the right exit code and egpud's message.
pub fn status(s: tonic::Status) -> anyhow::Error {
    let code = code_of_status(&s);
    let msg = if s.code() == Code::Unavailable {
        format!("egpud stopped answering ({}); is it still running?", s.message())
    } else if broke_off(&s) {
        format!("egpud's connection broke off before it answered ({}; did it exit or restart?): the request may or may not have been applied; check with `egpu ls`", s.message())
    } else if timed_out(&s) {
        format!("egpud did not answer within {} s; is it stopped or stuck? (check its log, or restart it: slices and workloads survive a restart)", egpu_node::client::REQUEST_TIMEOUT.as_secs())
    } else {
        s.message().to_string()
    };
    Failure::new(code, msg).into()
}

/// Exit code for any error of a command.
pub fn code_of(e: &anyhow::Error) -> i32 {
    if let Some(f) = e.downcast_ref::<Failure>() {
        return f.code;
    }
    if e.downcast_ref::<egpu_sim::cli::UsageError>().is_some() {
        return USAGE;
    }
    if e.downcast_ref::<egpu_node::client::ClientError>().is_some() {
        return UNREACHABLE;
    }
    if let Some(s) = e.downcast_ref::<tonic::Status>() {
        return code_of_status(s);
    }
    FAILURE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unanswered_request_is_unreachable_and_says_so() {
        // What tonic gives when the channel's timeout fires.
        let s = tonic::Status::cancelled("Timeout expired");
        assert_eq!(code_of_status(&s), UNREACHABLE);
        let e = status(s);
        assert_eq!(code_of(&e), UNREACHABLE);
        assert!(e.to_string().contains("did not answer within 30 s"), "{e}");
        // Any other cancellation stays a plain failure.
        assert_eq!(code_of_status(&tonic::Status::cancelled("client went away")), FAILURE);
    }

    #[test]
    fn a_connection_that_broke_off_is_unreachable_and_says_the_request_may_have_been_applied() {
        // What tonic gives when egpud dies with the request in flight.
        for s in [
            tonic::Status::unknown("transport error"),
            tonic::Status::cancelled("operation was canceled"),
            tonic::Status::internal("h2 protocol error: http2 error"),
            tonic::Status::unknown("protocol error: missing grpc-status trailer"),
        ] {
            assert_eq!(code_of_status(&s), UNREACHABLE, "{s:?}");
            let e = status(s);
            assert!(e.to_string().contains("broke off before it answered") && e.to_string().contains("may or may not have been applied"), "{e}");
        }
        // An error egpud itself answers stays a failure.
        assert_eq!(code_of_status(&tonic::Status::unknown("disk on fire")), FAILURE);
        assert_eq!(code_of_status(&tonic::Status::internal("slice table: state store egpud.redb: commit failed")), FAILURE);
    }
}
