//! Kubernetes name rules the binaries check their flags against, so that a
//! name the API server or the kubelet would refuse is refused at start-up
//! with the reason, not later in a log line: DNS subdomains (node names,
//! driver names) and extended resource names.

/// A DNS-1123 subdomain: at most 253 characters, dot-separated labels of
/// lower-case letters, digits and `-`, each 1–63 long and not starting or
/// ending with `-`.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') && !l.starts_with('-') && !l.ends_with('-'))
}

/// The name part of a qualified name: 1–63 characters of letters, digits,
/// `-`, `_` and `.`, starting and ending with a letter or digit.
fn is_qualified_name_part(s: &str) -> bool {
    let alnum = |b: Option<&u8>| b.is_some_and(u8::is_ascii_alphanumeric);
    !s.is_empty() && s.len() <= 63 && alnum(s.as_bytes().first()) && alnum(s.as_bytes().last()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// An extended resource name, as the API server checks one: `domain/name`
/// with a DNS-subdomain domain outside `kubernetes.io` (that domain is for
/// the native resources) and a qualified name part. `Err` says what is
/// wrong and gives an example.
pub fn check_extended_resource(s: &str) -> Result<(), String> {
    let eg = "e.g. egpu.io/gpu-memory";
    let Some((domain, name)) = s.split_once('/') else {
        return Err(format!("resource '{s}' needs a domain, {eg}"));
    };
    if !is_dns_subdomain(domain) {
        return Err(format!("resource '{s}': its domain '{domain}' is not a DNS subdomain (lower-case letters, digits, '-' and '.'), {eg}"));
    }
    if domain == "kubernetes.io" || domain.ends_with(".kubernetes.io") {
        return Err(format!("resource '{s}': the kubernetes.io domain is for Kubernetes' own resources, and the API server refuses an extended resource in it; use a domain of your own, {eg}"));
    }
    if !is_qualified_name_part(name) {
        return Err(format!("resource '{s}': its name '{name}' must be 1-63 letters, digits, '-', '_' or '.', beginning and ending with a letter or digit, {eg}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subdomains_and_resource_names_follow_the_api_servers_rules() {
        for ok in ["a", "node-1", "n1.example.com", &"a".repeat(63)] {
            assert!(is_dns_subdomain(ok), "{ok}");
        }
        for bad in ["", "A", "a_b", "-a", "a-", "a..b", ".a", &"a".repeat(64), &format!("{}.{}", "a".repeat(63), "b".repeat(190))] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
        for ok in ["egpu.io/gpu-memory", "example.com/GPU_mem.1", "a/b"] {
            assert_eq!(check_extended_resource(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("gpu-memory", "needs a domain"),
            ("", "needs a domain"),
            ("egpu.io/a b", "its name 'a b'"),
            ("egpu.io/", "its name ''"),
            ("egpu.io/-x", "its name '-x'"),
            ("Egpu.io/x", "not a DNS subdomain"),
            ("/x", "not a DNS subdomain"),
            ("kubernetes.io/gpu", "kubernetes.io domain"),
            ("node.kubernetes.io/gpu", "kubernetes.io domain"),
            ("egpu.io/a/b", "its name 'a/b'"),
        ] {
            let e = check_extended_resource(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
