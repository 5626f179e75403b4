//! Kubernetes name rules the binaries check their flags against, so that a
//! name the API server or the kubelet would refuse is refused at start-up
//! with the reason, not later in a log line: DNS subdomains (node names,
//! driver names) and extended resource names.

/// A DNS-1123 subdomain, as Kubernetes checks one (`IsDNS1123Subdomain`,
/// the rule for node and pod names): at most 253 characters, dot-separated
/// parts of lower-case letters, digits and `-`, none empty and none
/// starting or ending with `-`. (Kubernetes does not hold each part to 63
/// characters here, unlike DNS; [`is_dns_label`] is the 63-character rule.)
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') && !l.starts_with('-') && !l.ends_with('-'))
}

/// A DNS-1123 label (`IsDNS1123Label`, the rule for namespaces): one part
/// of a subdomain, at most 63 characters.
pub fn is_dns_label(s: &str) -> bool {
    s.len() <= 63 && !s.contains('.') && is_dns_subdomain(s)
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
    // The API server checks `requests.<name>` as a qualified name too,
    // whose prefix may have 253 characters: 244 are left for the domain.
    if !is_dns_subdomain(domain) || domain.len() > 244 {
        return Err(format!("resource '{s}': its domain '{domain}' is not a DNS subdomain of at most 244 characters (lower-case letters, digits, '-' and '.'), {eg}"));
    }
    // The API server keeps `requests.` for quota names (`requests.<resource>`).
    if domain.starts_with("requests.") {
        return Err(format!("resource '{s}': names beginning with 'requests.' are quota names, which the API server refuses as extended resources, {eg}"));
    }
    // The API server takes any name holding `kubernetes.io/` for a native one.
    if domain.ends_with("kubernetes.io") {
        return Err(format!("resource '{s}': the kubernetes.io domain is for Kubernetes' own resources, and the API server refuses an extended resource in it; use a domain of your own, {eg}"));
    }
    if !is_qualified_name_part(name) {
        return Err(format!("resource '{s}': its name '{name}' must be 1-63 letters, digits, '-', '_' or '.', beginning and ending with a letter or digit, {eg}"));
    }
    Ok(())
}

/// [`check_extended_resource`] as a clap value parser, for the binaries'
/// `--resource` flags.
pub fn resource_flag(s: &str) -> Result<String, String> {
    check_extended_resource(s).map(|()| s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subdomains_and_resource_names_follow_the_api_servers_rules() {
        // A part may be longer than 63 characters (a pod of a long name).
        for ok in ["a", "node-1", "n1.example.com", &"a".repeat(70), &"a".repeat(253)] {
            assert!(is_dns_subdomain(ok), "{ok}");
        }
        for bad in ["", "A", "a_b", "-a", "a-", "a..b", ".a", "a.", &"a".repeat(254)] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
        assert!(is_dns_label(&"a".repeat(63)) && !is_dns_label(&"a".repeat(64)) && !is_dns_label("a.b") && !is_dns_label("A"));
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
            ("mykubernetes.io/gpu", "kubernetes.io domain"),
            (&format!("{}/x", "a".repeat(245)), "at most 244 characters"),
            ("egpu.io/a/b", "its name 'a/b'"),
            ("requests.example.com/gpu", "quota names"),
        ] {
            let e = check_extended_resource(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
