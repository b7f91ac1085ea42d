use super::*;

fn host(s: &str) -> Host {
    Host::parse(s).unwrap()
}

fn secret(name: &str, hosts: &[&str], header: Option<&str>, query: Option<&str>) -> Secret {
    let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
    Secret::new(
        name,
        format!("{PLACEHOLDER_PREFIX}{}", name.to_ascii_lowercase()),
        Zeroizing::new(format!("value-of-{name}")),
        &hosts,
        header,
        query,
        false,
    )
    .unwrap()
}

fn text(v: &[u8]) -> &str {
    std::str::from_utf8(v).unwrap()
}

#[test]
fn a_placeholder_is_replaced_only_for_the_hosts_the_secret_names() {
    let s = vec![secret("API_KEY", &["api.test"], None, None)];
    let head = b"GET /v1?k=allox-secret-placeholder-api_key HTTP/1.1\r\nHost: api.test\r\n\
Authorization: Bearer allox-secret-placeholder-api_key\r\n\r\n";
    let (out, done) = inject(head, &host("api.test"), 443, &s);
    let out = text(&out);
    assert!(
        out.starts_with("GET /v1?k=value-of-API_KEY HTTP/1.1\r\n"),
        "{out}"
    );
    assert!(
        out.contains("Authorization: Bearer value-of-API_KEY\r\n"),
        "{out}"
    );
    assert!(!out.contains(PLACEHOLDER_PREFIX), "{out}");
    assert_eq!(done.injected, vec!["API_KEY".to_string()]);
    assert!(done.withheld.is_empty());

    let (out, done) = inject(head, &host("echo.test"), 443, &s);
    assert_eq!(out, head.to_vec(), "another host gets the head as it was");
    assert!(done.injected.is_empty());
    assert_eq!(done.withheld, vec!["API_KEY".to_string()]);
}

#[test]
fn rules_match_as_the_policy_s_do_ports_and_subdomains() {
    let s = vec![secret("K", &["*.api.test:8443"], None, None)];
    let head = b"GET / HTTP/1.1\r\nX-K: allox-secret-placeholder-k\r\n\r\n";
    assert_eq!(
        inject(head, &host("eu.api.test"), 8443, &s).1.injected,
        vec!["K"]
    );
    assert_eq!(
        inject(head, &host("eu.api.test"), 443, &s).1.withheld,
        vec!["K"]
    );
    assert_eq!(
        inject(head, &host("api.test"), 8443, &s).1.withheld,
        vec!["K"]
    );
}

#[test]
fn a_header_template_replaces_what_the_client_sent_and_a_query_is_added() {
    let s = vec![
        secret(
            "TOKEN",
            &["git.test"],
            Some("Authorization: Bearer {}"),
            None,
        ),
        secret("Q", &["git.test"], None, Some("api_key")),
    ];
    let head = b"GET /repo.git/info/refs?service=git-upload-pack HTTP/1.1\r\nHost: git.test\r\n\
authorization: Basic Zm9vOmJhcg==\r\n\r\n";
    let (out, done) = inject(head, &host("git.test"), 443, &s);
    let out = text(&out);
    assert!(
        out.starts_with(
            "GET /repo.git/info/refs?service=git-upload-pack&api_key=value-of-Q HTTP/1.1\r\n"
        ),
        "{out}"
    );
    assert!(
        out.contains("Authorization: Bearer value-of-TOKEN\r\n"),
        "{out}"
    );
    assert!(
        !out.contains("Basic"),
        "the client's own header is replaced: {out}"
    );
    assert!(out.ends_with("\r\n\r\n"));
    assert_eq!(done.injected, vec!["TOKEN", "Q"]);
}

#[test]
fn a_head_without_a_placeholder_or_template_is_left_as_it_was() {
    let s = vec![secret("K", &["api.test"], None, None)];
    let head = b"GET / HTTP/1.1\r\nHost: api.test\r\n\r\n";
    let (out, done) = inject(head, &host("api.test"), 80, &s);
    assert_eq!(out, head.to_vec());
    assert_eq!(done, Injected::default());
}

#[test]
fn bad_secrets_are_refused_naming_what_is_wrong() {
    let v = || Zeroizing::new("v".to_string());
    let h = vec!["api.test".to_string()];
    let err = |name: &str, value: Zeroizing<String>, hosts: &[String], header, query| {
        Secret::new(name, placeholder(), value, hosts, header, query, false)
            .unwrap_err()
            .to_string()
    };
    assert!(err("9X", v(), &h, None, None).contains("not starting with a digit"));
    assert!(err("A-B", v(), &h, None, None).contains("letters, digits and '_'"));
    assert!(err("HTTPS_PROXY", v(), &h, None, None).contains("reserved"));
    assert!(err("ALLOX_X", v(), &h, None, None).contains("reserved"));
    assert!(err("K", Zeroizing::new(String::new()), &h, None, None).contains("empty"));
    assert!(err("K", Zeroizing::new("a\r\nb".into()), &h, None, None).contains("control"));
    assert!(err("K", v(), &[], None, None).contains("no host"));
    assert!(err("K", v(), &["*".to_string()], None, None).contains("anywhere"));
    assert!(err("K", v(), &["a b".to_string()], None, None).contains("\"a b\""));
    assert!(err("K", v(), &h, Some("Authorization Bearer {}"), None).contains("Name: value"));
    assert!(err("K", v(), &h, Some("Authorization: Bearer"), None).contains("`{}` once"));
    assert!(err("K", v(), &h, Some("Host: {}"), None).contains("does not set"));
    assert!(err("K", v(), &h, None, Some("a&b")).contains("parameter"));
}

#[test]
fn debug_output_never_holds_the_value() {
    let s = secret("API_KEY", &["api.test"], Some("X-Key: {}"), None);
    let shown = format!("{s:?}");
    assert!(shown.contains("API_KEY"), "{shown}");
    assert!(!shown.contains("value-of"), "{shown}");
}

#[test]
fn placeholders_are_random() {
    let (a, b) = (placeholder(), placeholder());
    assert_ne!(a, b);
    assert!(a.starts_with(PLACEHOLDER_PREFIX));
    assert_eq!(a.len(), PLACEHOLDER_PREFIX.len() + 32);
}
