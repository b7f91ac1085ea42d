use super::*;

fn layer(level: &'static str, allow: Option<&[&str]>, deny: &[&str]) -> Layer {
    Layer::new(level, allow, deny).unwrap()
}

fn name(h: &str) -> Host {
    Host::parse(h).unwrap()
}

#[test]
fn rules_read_names_domains_addresses_networks_and_ports() {
    for (text, host, port, hit) in [
        ("example.com", "example.com", 80, true),
        ("example.com", "EXAMPLE.com.", 443, true),
        ("example.com", "www.example.com", 80, false),
        ("example.com:443", "example.com", 443, true),
        ("example.com:443", "example.com", 80, false),
        ("*.example.com", "a.example.com", 80, true),
        ("*.example.com", "a.b.example.com", 80, true),
        ("*.example.com", "example.com", 80, false),
        ("*.example.com", "badexample.com", 80, false),
        ("*", "anything.test", 1, true),
        ("*:22", "anything.test", 22, true),
        ("*:22", "anything.test", 23, false),
        ("203.0.113.7", "203.0.113.7", 80, true),
        ("203.0.113.0/24", "203.0.113.200", 80, true),
        ("203.0.113.0/24", "203.0.114.1", 80, false),
        ("203.0.113.0/24:5432", "203.0.113.9", 5432, true),
        ("[2001:db8::1]:22", "[2001:db8::1]", 22, true),
        ("2001:db8::/32", "2001:db8:1::5", 80, true),
        ("2001:db8::/32", "2001:db9::5", 80, false),
        ("0.0.0.0/0", "198.51.100.1", 80, true),
        ("example.com", "203.0.113.7", 80, false),
    ] {
        let r = Rule::parse(text).unwrap();
        assert_eq!(
            r.matches_target(&name(host), port),
            hit,
            "{text} vs {host}:{port}"
        );
    }
}

#[test]
fn bad_rules_are_refused_naming_what_is_wrong() {
    for (text, want) in [
        ("", "empty rule"),
        ("example.com:0", "port \"0\""),
        ("example.com:http", "port \"http\""),
        ("example.com:70000", "port \"70000\""),
        ("10.0.0.0/33", "prefix \"33\""),
        ("ex ample.com", "ASCII letters"),
        ("a.*.example.com", "'*' only alone"),
        ("-bad.example.com", "starting or ending with '-'"),
        ("[2001:db8::1", "'[' without ']'"),
        ("[2001:db8::1]x", "only ':PORT'"),
        ("foo/8", "a network is an address"),
    ] {
        let e = Rule::parse(text).unwrap_err().to_string();
        assert!(e.contains(want), "{text:?}: {e}");
    }
}

#[test]
fn deny_wins_and_without_an_allow_list_a_layer_does_not_narrow() {
    let p = Policy::new(vec![layer(
        "session",
        Some(&["*.example.com", "pypi.test"]),
        &["evil.example.com"],
    )]);
    assert!(p.check_target(&name("a.example.com"), 443).allowed());
    assert!(p.check_target(&name("pypi.test"), 80).allowed());
    assert_eq!(
        p.check_target(&name("evil.example.com"), 443),
        Verdict::Denied {
            level: "session",
            rule: "evil.example.com".into()
        }
    );
    assert_eq!(
        p.check_target(&name("other.test"), 443),
        Verdict::NotAllowed { level: "session" }
    );
    // A layer with only a deny list narrows what another allows.
    let open = Policy::new(vec![
        layer("daemon", None, &["*.internal.test"]),
        layer("session", Some(&["*"]), &[]),
    ]);
    assert!(open.check_target(&name("pypi.test"), 443).allowed());
    assert!(!open.check_target(&name("db.internal.test"), 5432).allowed());
    // With no allow list anywhere, nothing is open (default deny).
    let none = Policy::new(vec![
        layer("daemon", None, &["*.internal.test"]),
        layer("agent", None, &[]),
    ]);
    assert_eq!(
        none.check_target(&name("pypi.test"), 443),
        Verdict::Unlisted
    );
    assert_eq!(
        Policy::default().check_target(&name("pypi.test"), 443),
        Verdict::Unlisted
    );
}

#[test]
fn a_later_layer_cannot_open_what_an_earlier_one_denied_or_did_not_allow() {
    let p = Policy::new(vec![
        layer("daemon", Some(&["*.test"]), &["secret.test"]),
        layer("agent", None, &[]),
        layer("session", Some(&["*", "secret.test"]), &[]),
    ]);
    assert_eq!(
        p.check_target(&name("secret.test"), 443),
        Verdict::Denied {
            level: "daemon",
            rule: "secret.test".into()
        }
    );
    assert_eq!(
        p.check_target(&name("example.com"), 443),
        Verdict::NotAllowed { level: "daemon" }
    );
    assert!(p.check_target(&name("pypi.test"), 443).allowed());
}

#[test]
fn special_addresses_need_an_allow_rule_naming_them() {
    let by_name = Policy::new(vec![layer("session", Some(&["pypi.test"]), &[])]);
    for a in [
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "127.0.0.1",
        "169.254.169.254",
        "169.254.1.1",
        "100.64.0.1",
        "0.0.0.0",
        "::1",
        "fd00::1",
        "fe80::1",
        "::ffff:10.0.0.1",
        "fd00:ec2::254",
        "224.0.0.1",
        // IPv4 addresses embedded in IPv6 forms a gateway may translate:
        // NAT64 (DNS64 gives such an address to every IPv4-only name),
        // IPv4-compatible, and reserved ranges.
        "64:ff9b::7f00:1",
        "64:ff9b::a00:1",
        "64:ff9b::a9fe:a9fe",
        "64:ff9b:1::a00:1",
        "::a00:1",
        "::7f00:1",
        "2002:a00:1::1",
        "2001:0:a00:1::1",
        "2001:db8::1",
        "100::1",
        "fec0::1",
    ] {
        let addr: IpAddr = a.parse().unwrap();
        assert!(
            matches!(by_name.check_address(addr, 443), Verdict::Special { .. }),
            "{a}"
        );
    }
    // A public address of an allowed name passes, and so does its NAT64
    // form.
    assert!(by_name
        .check_address("198.51.100.1".parse().unwrap(), 443)
        .allowed());
    assert!(by_name
        .check_address("64:ff9b::c633:6401".parse().unwrap(), 443)
        .allowed());
    // Named by address or network (and port), it opens.
    let named = Policy::new(vec![layer(
        "session",
        Some(&["pypi.test", "127.0.0.1:8080", "10.0.0.0/8"]),
        &[],
    )]);
    assert!(named
        .check_address("127.0.0.1".parse().unwrap(), 8080)
        .allowed());
    assert!(!named
        .check_address("127.0.0.1".parse().unwrap(), 8081)
        .allowed());
    assert!(named
        .check_address("10.9.9.9".parse().unwrap(), 443)
        .allowed());
    // `*` alone does not name them.
    let any = Policy::new(vec![layer("session", Some(&["*"]), &[])]);
    assert!(!any
        .check_address("10.9.9.9".parse().unwrap(), 443)
        .allowed());
    // Nor does a layer without an allow list.
    let open = Policy::new(vec![layer("daemon", None, &[])]);
    assert!(!open
        .check_address("127.0.0.1".parse().unwrap(), 80)
        .allowed());
}

#[test]
fn a_literal_address_target_is_checked_as_an_address_too() {
    let p = Policy::new(vec![layer("session", Some(&["*"]), &["203.0.113.0/24"])]);
    assert!(!p.check_target(&name("203.0.113.5"), 80).allowed());
    assert!(!p.check_target(&name("10.0.0.1"), 80).allowed());
    assert!(p.check_target(&name("198.51.100.1"), 80).allowed());
    // A deny network also judges the resolved addresses of names.
    assert!(p.check_target(&name("host.test"), 80).allowed());
    assert!(!p
        .check_address("203.0.113.9".parse().unwrap(), 80)
        .allowed());
}

#[test]
fn verdicts_say_why() {
    let v = Verdict::Special {
        addr: "10.0.0.1".parse().unwrap(),
        class: "private",
    };
    assert!(v.to_string().contains("10.0.0.1 (private)"), "{v}");
    let d = Verdict::Denied {
        level: "session",
        rule: "x.test".into(),
    };
    assert_eq!(d.to_string(), "denied by the session rule \"x.test\"");
}

#[test]
fn a_host_is_named_by_its_name_address_or_network_at_every_level_not_by_wildcards() {
    let loopback = name("127.0.0.1");
    let named = |levels: Vec<Layer>, h: &Host| Policy::new(levels).names(h);
    // By address (on one port: the environment has no ports), or by a
    // network holding it.
    for rule in ["127.0.0.1:8095", "127.0.0.1", "127.0.0.0/8"] {
        assert!(
            named(vec![layer("session", Some(&[rule]), &[])], &loopback),
            "{rule}"
        );
    }
    // Not by another address, not by `*`, not by a name.
    for rule in ["127.0.0.2", "*", "*:8095", "localhost"] {
        assert!(
            !named(vec![layer("session", Some(&[rule]), &[])], &loopback),
            "{rule}"
        );
    }
    // Every level with an allow list must name it; a level without one
    // does not narrow; a deny rule on the only port named closes it.
    let session = || layer("session", Some(&["127.0.0.1:8095"]), &[]);
    assert!(named(
        vec![layer("daemon", None, &[]), session()],
        &loopback
    ));
    assert!(!named(
        vec![layer("daemon", Some(&["*"]), &[]), session()],
        &loopback
    ));
    assert!(named(
        vec![layer("daemon", Some(&["127.0.0.0/8"]), &[]), session()],
        &loopback
    ));
    assert!(!named(
        vec![layer("agent", None, &["127.0.0.1:8095"]), session()],
        &loopback
    ));
    // Denied on another port, it is still named on this one.
    assert!(named(
        vec![layer("agent", None, &["127.0.0.1:22"]), session()],
        &loopback
    ));
    // A name by that name only: `*` and `*.domain` match it but do not
    // name it.
    let localhost = name("localhost");
    assert!(named(
        vec![layer("session", Some(&["localhost:3000"]), &[])],
        &localhost
    ));
    for rule in ["*", "*.localhost", "127.0.0.1"] {
        assert!(
            !named(vec![layer("session", Some(&[rule]), &[])], &localhost),
            "{rule}"
        );
    }
    let v6 = name("::1");
    assert!(named(vec![layer("session", Some(&["[::1]:80"]), &[])], &v6));
    assert!(!named(vec![layer("session", Some(&["*"]), &[])], &v6));
}
