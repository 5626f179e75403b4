//! `egpu simulate`.
