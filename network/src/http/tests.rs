use super::*;

fn host(s: &str) -> Host {
    Host::parse(s).unwrap()
}

#[test]
fn connect_names_host_and_port() {
    let raw = b"CONNECT pypi.test:443 HTTP/1.1\r\nHost: pypi.test:443\r\n\r\nrest";
    let r = parse(raw).unwrap().unwrap();
    assert_eq!(r.ask, Ask::Connect);
    assert_eq!((r.host, r.port), (host("pypi.test"), 443));
    assert_eq!(&raw[r.head_len..], b"rest");
    let r = parse(b"CONNECT [2001:db8::1]:22 HTTP/1.1\r\n\r\n")
        .unwrap()
        .unwrap();
    assert_eq!((r.host, r.port), (host("2001:db8::1"), 22));
}

#[test]
fn an_absolute_uri_is_forwarded_in_origin_form_without_the_proxys_headers() {
    let raw = b"GET http://Files.test:8080/simple/pkg/?x=1 HTTP/1.1\r\n\
Host: files.test:8080\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\n\
Connection: keep-alive\r\nKeep-Alive: 5\r\nAccept: */*\r\n\r\nbody";
    let r = parse(raw).unwrap().unwrap();
    assert_eq!((r.host.clone(), r.port), (host("files.test"), 8080));
    assert_eq!(&raw[r.head_len..], b"body");
    let Ask::Forward { head } = r.ask else {
        panic!("{:?}", r.ask)
    };
    assert_eq!(
        String::from_utf8(head).unwrap(),
        "GET /simple/pkg/?x=1 HTTP/1.1\r\nHost: files.test:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    // No path, no Host header: both supplied; the default port is 80.
    let r = parse(b"HEAD http://a.test HTTP/1.1\r\n\r\n")
        .unwrap()
        .unwrap();
    assert_eq!(r.port, 80);
    let Ask::Forward { head } = r.ask else {
        panic!()
    };
    assert_eq!(
        String::from_utf8(head).unwrap(),
        "HEAD / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n"
    );
}

/// The server gets the `Host` of the URI the request was judged for (and
/// a secret injected for), never one the client wrote: another virtual
/// host behind the same address would get what was meant for this one.
#[test]
fn the_client_s_own_host_headers_are_replaced_by_the_judged_one() {
    let raw = b"GET http://web.test:18082/x HTTP/1.1\r\nHost: attacker.example\r\n\
Accept: */*\r\nhost: web.test\r\n\r\n";
    let r = parse(raw).unwrap().unwrap();
    assert_eq!(r.host, host("web.test"));
    let Ask::Forward { head } = r.ask else {
        panic!("{:?}", r.ask)
    };
    assert_eq!(
        String::from_utf8(head).unwrap(),
        "GET /x HTTP/1.1\r\nHost: web.test:18082\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    // Inside an intercepted connection to web.test: the same.
    let (head, _) = parse_origin(
        b"GET /y HTTP/1.1\r\nHost: attacker.example\r\n\r\n",
        "web.test:443",
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        String::from_utf8(head).unwrap(),
        "GET /y HTTP/1.1\r\nHost: web.test:443\r\nConnection: close\r\n\r\n"
    );
}

#[test]
fn a_partial_head_asks_for_more_and_a_huge_one_is_refused() {
    assert_eq!(
        parse(b"CONNECT a.test:443 HTTP/1.1\r\nHost: a").unwrap(),
        None
    );
    let mut big = b"GET http://a.test/ HTTP/1.1\r\n".to_vec();
    while big.len() < MAX_HEAD {
        big.extend_from_slice(b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
    }
    let e = parse(&big).unwrap_err();
    assert!(
        matches!(e, HeadError::TooLarge | HeadError::Malformed(_)),
        "{e:?}"
    );
    assert_eq!(HeadError::TooLarge.status().0, 431);
}

#[test]
fn what_is_not_a_proxy_request_is_refused_saying_why() {
    for (raw, status, says) in [
        (
            &b"GET /index.html HTTP/1.1\r\n\r\n"[..],
            400,
            "absolute http:// URI",
        ),
        (
            b"GET https://a.test/ HTTP/1.1\r\n\r\n",
            501,
            "through CONNECT",
        ),
        (b"CONNECT a.test HTTP/1.1\r\n\r\n", 400, "no port"),
        (b"CONNECT a.test:0 HTTP/1.1\r\n\r\n", 400, "1 to 65535"),
        (b"CONNECT a.test:99999 HTTP/1.1\r\n\r\n", 400, "1 to 65535"),
        (b"CONNECT bad host:443 HTTP/1.1\r\n\r\n", 400, ""),
        (
            b"GET http://user:pw@a.test/ HTTP/1.1\r\n\r\n",
            501,
            "user information",
        ),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400, ""),
    ] {
        let e = parse(raw).unwrap_err();
        assert_eq!(e.status().0, status, "{raw:?}: {e}");
        assert!(e.to_string().contains(says), "{raw:?}: {e}");
    }
}

#[test]
fn a_refusal_is_a_complete_response_with_its_reason() {
    let a = String::from_utf8(answer(403, "Forbidden", "pypi.test:443 is not allowed")).unwrap();
    assert!(a.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{a}");
    let (head, body) = a.split_once("\r\n\r\n").unwrap();
    assert!(
        head.contains(&format!("Content-Length: {}", body.len())),
        "{a}"
    );
    assert_eq!(body, "allox proxy: pypi.test:443 is not allowed\n");
}

#[test]
fn a_tunnel_asked_in_http_1_0_is_opened_as_python_asks_for_it() {
    let r = parse(b"CONNECT api.test:443 HTTP/1.0\r\n\r\n")
        .unwrap()
        .unwrap();
    assert_eq!(r.ask, Ask::Connect);
    assert_eq!((r.host, r.port), (host("api.test"), 443));
    let r = parse(b"GET http://a.test/x HTTP/1.0\r\n\r\n")
        .unwrap()
        .unwrap();
    let Ask::Forward { head } = r.ask else {
        panic!("{:?}", r.ask)
    };
    assert!(head.starts_with(b"GET /x HTTP/1.1\r\n"), "{head:?}");
}
