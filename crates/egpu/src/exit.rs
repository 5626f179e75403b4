//! Exit codes of `egpu`, and the mapping from errors to them.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success |
//! | 1 | other failure |
//! | 2 | usage error: bad flag or value (also a request egpud calls invalid) |
//! | 3 | not found: unknown slice or device |
//! | 4 | rejected: would overcommit a device, name taken, slice busy |
//! | 5 | cannot reach egpud |
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
        _ => FAILURE,
    }
}

/// Turns an egpud status into an error with the right exit code and egpud's message.
pub fn status(s: tonic::Status) -> anyhow::Error {
    let code = code_of_status(&s);
    let msg = if s.code() == Code::Unavailable {
        format!("egpud stopped answering ({}); is it still running?", s.message())
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
