//! Elastic.
