use super::*;

/// The credentials of AWS's published examples.
const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";

/// The gate's clock at the test suite's examples (2015-08-30T12:36:00Z), at S3's
/// (2013-05-24T00:00:00Z), and at this module's own (2026-12-05T10:15:00Z).
const SUITE: u64 = 1_440_938_160;
const S3_EXAMPLE: u64 = 1_369_353_600;
const NOW: u64 = 1_796_465_700;

fn hash(body: &[u8]) -> String {
    body_hash(digest::digest(&digest::SHA256, body))
}

fn headers(pairs: &[(&str, &str)]) -> hyper::HeaderMap {
    let mut h = hyper::HeaderMap::new();
    for (k, v) in pairs {
        h.append(hyper::header::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
    }
    h
}

fn head<'a>(method: &'a str, path: &'a str, query: Option<&'a str>, h: &'a hyper::HeaderMap) -> Head<'a> {
    Head { method, path, query, headers: h, host: "example.amazonaws.com" }
}

const VANILLA: &str = "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
                       SignedHeaders=host;x-amz-date, \
                       Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31";

#[test]
fn the_test_suites_vanilla_get_verifies_and_another_secret_does_not() {
    let h = headers(&[("x-amz-date", "20150830T123600Z"), ("authorization", VANILLA)]);
    let r = head("GET", "/", None, &h);
    let sig = parse(&r).unwrap().expect("signed");
    assert_eq!((sig.form, sig.key_id.as_str()), (Form::Header, "AKIDEXAMPLE"));
    assert_eq!(sig.scope, "20150830/us-east-1/service/aws4_request");
    let v = verify(&r, &sig, SECRET, Some(&hash(b"")), SUITE).expect("AWS's own example verifies");
    assert!(v.normalised, "a service not S3's: its path encoded once more");
    assert!(verify(&r, &sig, "another-secret", Some(&hash(b"")), SUITE).is_err());
    // The date is signed: another one does not verify.
    let h2 = headers(&[("x-amz-date", "20150830T123601Z"), ("authorization", VANILLA)]);
    assert!(verify(&head("GET", "/", None, &h2), &sig, SECRET, Some(&hash(b"")), SUITE).is_err());
}

#[test]
fn the_query_is_decoded_encoded_again_and_sorted() {
    // The test suite's get-vanilla-query-order-key-case.
    let auth = "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
                SignedHeaders=host;x-amz-date, \
                Signature=b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500";
    let h = headers(&[("x-amz-date", "20150830T123600Z"), ("authorization", auth)]);
    let r = head("GET", "/", Some("Param2=value2&Param1=value1"), &h);
    let sig = parse(&r).unwrap().unwrap();
    assert!(verify(&r, &sig, SECRET, Some(&hash(b"")), SUITE).is_ok());
    assert_eq!(canonical_query(Some("b=%2f&a=x%3Ay&c"), Form::Header).unwrap(), "a=x%3Ay&b=%2F&c=");
}

#[test]
fn s3s_presigned_example_verifies_with_an_unsigned_payload() {
    let q = "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request\
             &X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host\
             &X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404";
    let h = headers(&[]);
    let r = Head { host: "examplebucket.s3.amazonaws.com", ..head("GET", "/test.txt", Some(q), &h) };
    let sig = parse(&r).unwrap().unwrap();
    assert_eq!(sig.form, Form::Query);
    let v = verify(&r, &sig, "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", None, S3_EXAMPLE)
        .expect("AWS's S3 example");
    assert_eq!(v.payload, "UNSIGNED-PAYLOAD");
}

/// A request signed by `creds` the way botocore signs every service but S3 (the path encoded
/// once more), with its body's hash.
fn signed_by(creds: Creds, path: &str, body: &[u8], token_header: bool) -> hyper::HeaderMap {
    let mut h = headers(&[("x-amz-date", "20261205T101500Z"), ("content-type", "application/json")]);
    if token_header {
        h.insert("x-amz-security-token", creds.token.unwrap().parse().unwrap());
    }
    let r = head("POST", path, None, &h);
    let mut names = vec!["content-type".to_string(), "host".into(), "x-amz-date".into()];
    if token_header {
        names.push("x-amz-security-token".into());
    }
    let scope = "20261205/us-east-1/bedrock/aws4_request";
    let v = Variant { normalised: true, payload: hash(body) };
    let hdrs = canonical_headers(&r, &names, |_, v| Ok(v.to_string())).unwrap();
    let cr = canonical(&r, &v, &canonical_query(None, Form::Header).unwrap(), &hdrs, &names.join(";"));
    let sig = sign(creds.secret, scope, "20261205T101500Z", &cr);
    let auth = format!(
        "{ALGORITHM} Credential={}/{scope}, SignedHeaders={}, Signature={sig}",
        creds.key_id,
        names.join(";")
    );
    h.insert("authorization", auth.parse().unwrap());
    h
}

const PLACEHOLDER: Creds = Creds {
    key_id: "aisb_placeholder_0a1b2c3d4e5f6a7b",
    secret: "aisb_placeholder_9f8e7d6c5b4a39281706f5e4",
    token: Some("aisb_placeholder_1122334455667788"),
};
const REAL: Creds = Creds {
    key_id: "ASIAREALKEYID0000001",
    secret: "realSecretKey/0000000000000000000000000+",
    token: Some("IQoJb3JpZ2luX2VjEreal//token=="),
};

#[test]
fn a_placeholder_signature_is_made_again_with_the_real_credentials() {
    // Bedrock's model id holds a `:`, which the path carries encoded, and the signer once more.
    let path = "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/invoke";
    let body = br#"{"messages":[]}"#;
    let h = signed_by(PLACEHOLDER, path, body, true);
    let r = head("POST", path, None, &h);
    let sig = parse(&r).unwrap().unwrap();
    assert_eq!(sig.key_id, PLACEHOLDER.key_id);
    let v =
        verify(&r, &sig, PLACEHOLDER.secret, Some(&hash(body)), NOW).expect("signed with the placeholders");
    assert!(v.normalised, "the path was signed encoded once more");
    assert!(
        verify(&r, &sig, PLACEHOLDER.secret, Some(&hash(b"another body")), NOW).is_err(),
        "the body is signed"
    );
    let Resigned::Header { authorization, token, hex } =
        resign(&r, &sig, &v, REAL, PLACEHOLDER, NOW).unwrap()
    else {
        panic!("a header stays a header")
    };
    assert_eq!(token.as_deref(), REAL.token);
    assert!(authorization.contains(&format!("Credential={}/{}", REAL.key_id, sig.scope)));
    // What upstream receives verifies with the real secret, and with no placeholder.
    let mut sent = h.clone();
    sent.insert("authorization", authorization.parse().unwrap());
    sent.insert("x-amz-security-token", token.unwrap().parse().unwrap());
    let up = head("POST", path, None, &sent);
    let upsig = parse(&up).unwrap().unwrap();
    assert_eq!(upsig.hex, hex);
    assert_eq!(verify(&up, &upsig, REAL.secret, Some(&hash(body)), NOW).unwrap(), v);
    assert!(verify(&up, &upsig, PLACEHOLDER.secret, Some(&hash(body)), NOW).is_err());
}

#[test]
fn a_header_the_gate_took_out_leaves_the_signed_list_and_a_foreign_token_is_refused() {
    let path = "/model/m/invoke";
    let mut h = signed_by(PLACEHOLDER, path, b"", true);
    let r = head("POST", path, None, &h);
    let sig = parse(&r).unwrap().unwrap();
    let v = verify(&r, &sig, PLACEHOLDER.secret, Some(&hash(b"")), NOW).unwrap();
    h.remove("content-type");
    let Resigned::Header { authorization, .. } =
        resign(&head("POST", path, None, &h), &sig, &v, REAL, PLACEHOLDER, NOW).unwrap()
    else {
        panic!()
    };
    assert!(authorization.contains("SignedHeaders=host;x-amz-date;x-amz-security-token,"), "{authorization}");
    h.insert("x-amz-security-token", "someone-elses-token".parse().unwrap());
    let err = resign(&head("POST", path, None, &h), &sig, &v, REAL, PLACEHOLDER, NOW).unwrap_err();
    assert!(err.contains("not this session's placeholder"), "{err}");
}

#[test]
fn a_presigned_url_gets_the_real_credential_token_and_signature() {
    let q = format!(
        "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={}%2F20261205%2Fus-east-1%2Fs3%2Faws4_request\
         &X-Amz-Date=20261205T101500Z&X-Amz-Expires=60&X-Amz-SignedHeaders=host&X-Amz-Security-Token={}",
        PLACEHOLDER.key_id,
        PLACEHOLDER.token.unwrap()
    );
    let h = headers(&[]);
    let unsigned = head("GET", "/bucket/key", Some(&q), &h);
    let sig = Signature {
        form: Form::Query,
        key_id: PLACEHOLDER.key_id.into(),
        scope: "20261205/us-east-1/s3/aws4_request".into(),
        amz_date: "20261205T101500Z".into(),
        signed: vec!["host".into()],
        hex: String::new(),
    };
    let v = Variant { normalised: false, payload: UNSIGNED.into() };
    let hdrs = canonical_headers(&unsigned, &sig.signed, |_, v| Ok(v.to_string())).unwrap();
    let cr = canonical(&unsigned, &v, &canonical_query(Some(&q), Form::Query).unwrap(), &hdrs, "host");
    let q = format!("{q}&X-Amz-Signature={}", sign(PLACEHOLDER.secret, &sig.scope, &sig.amz_date, &cr));
    let r = head("GET", "/bucket/key", Some(&q), &h);
    let sig = parse(&r).unwrap().unwrap();
    let v = verify(&r, &sig, PLACEHOLDER.secret, Some(&hash(b"")), NOW).unwrap();
    let Resigned::Query { query, .. } = resign(&r, &sig, &v, REAL, PLACEHOLDER, NOW).unwrap() else {
        panic!()
    };
    assert!(!query.contains("aisb_placeholder_"), "{query}");
    assert!(query.contains("X-Amz-Credential=ASIAREALKEYID0000001%2F20261205"), "{query}");
    assert!(
        query.contains(&format!("X-Amz-Security-Token={}", encode(REAL.token.unwrap(), false))),
        "{query}"
    );
    let up = head("GET", "/bucket/key", Some(&query), &h);
    let upsig = parse(&up).unwrap().unwrap();
    assert!(verify(&up, &upsig, REAL.secret, None, NOW).is_ok());
}

#[test]
fn what_cannot_be_read_or_signed_again_is_refused_with_why() {
    let refused = |pairs: &[(&str, &str)], query: Option<&str>| {
        let h = headers(pairs);
        parse(&head("GET", "/", query, &h)).unwrap_err()
    };
    let v4a =
        "AWS4-ECDSA-P256-SHA256 Credential=A/20150830/s3/aws4_request, SignedHeaders=host, Signature=00";
    assert!(refused(&[("authorization", v4a)], None).contains("SigV4a"));
    let both = refused(&[("authorization", VANILLA)], Some("X-Amz-Signature=00"));
    assert!(both.contains("signed twice"), "{both}");
    let twice =
        VANILLA.replace("SignedHeaders=host;x-amz-date", "SignedHeaders=host;x-amz-date, Signature=00");
    assert!(refused(&[("authorization", &twice)], None).contains("twice"));
    let unsorted = VANILLA.replace("host;x-amz-date", "x-amz-date;host");
    assert!(refused(&[("authorization", &unsorted)], None).contains("sorted"));
    let dup = VANILLA.replace("host;x-amz-date", "host;host;x-amz-date");
    assert!(refused(&[("authorization", &dup)], None).contains("sorted"), "a name twice");
    let upper = VANILLA.replace("host;x-amz-date", "a-B;host");
    assert!(refused(&[("authorization", &upper)], None).contains("lowercase"));
    let empty = VANILLA.replace("host;x-amz-date", ";host");
    assert!(refused(&[("authorization", &empty)], None).contains("lowercase"));
    let sig_hex = "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31";
    for bad in ["5FA00FA31553B73EBF1942676E86291E8372FF2A2260956D9B8AAE1D763FBF31", &sig_hex[..63]] {
        let odd = VANILLA.replace(sig_hex, bad);
        assert!(refused(&[("authorization", &odd)], None).contains("64 lowercase hex"), "{bad}");
    }
    let no_host = VANILLA.replace("host;x-amz-date", "x-amz-date");
    assert!(refused(&[("authorization", &no_host)], None).contains("with host"));
    let scope = VANILLA.replace("/service/aws4_request", "/aws4_request");
    assert!(refused(&[("authorization", &scope)], None).contains("scope"));
    // Not SigV4 at all: nothing to do.
    let h = headers(&[("authorization", "Bearer x")]);
    assert_eq!(parse(&head("GET", "/", None, &h)).unwrap(), None);
    // A chunk-signed body.
    let h = headers(&[
        ("x-amz-date", "20150830T123600Z"),
        ("authorization", VANILLA),
        ("x-amz-content-sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"),
    ]);
    let r = head("PUT", "/", None, &h);
    let sig = parse(&r).unwrap().unwrap();
    assert!(verify(&r, &sig, SECRET, None, SUITE).unwrap_err().contains("chunk by chunk"));
    // A date not of the scope's day.
    let h = headers(&[("x-amz-date", "20150831T123600Z"), ("authorization", VANILLA)]);
    let r = head("GET", "/", None, &h);
    assert!(
        verify(&r, &parse(&r).unwrap().unwrap(), SECRET, Some(&hash(b"")), SUITE)
            .unwrap_err()
            .contains("scope's day")
    );
}

#[test]
fn dot_segments_and_empty_segments_go_from_the_path() {
    assert_eq!(remove_dot_segments("/a/./b/../c//d/"), "/a/c/d/");
    assert_eq!(remove_dot_segments("/"), "/");
    assert_eq!(remove_dot_segments("/../.."), "/");
}

#[test]
fn a_signature_far_from_the_gates_clock_is_not_signed_again() {
    let h = headers(&[("x-amz-date", "20150830T123600Z"), ("authorization", VANILLA)]);
    let r = head("GET", "/", None, &h);
    let sig = parse(&r).unwrap().unwrap();
    // Dated at most a minute ahead of the gate's clock, and at most 15 minutes behind it.
    for ok in [SUITE - AHEAD, SUITE, SUITE + SKEW] {
        assert!(verify(&r, &sig, SECRET, Some(&hash(b"")), ok).is_ok(), "{ok}");
    }
    for far in [SUITE - AHEAD - 1, SUITE + SKEW + 1, 0, u64::MAX] {
        let e = verify(&r, &sig, SECRET, Some(&hash(b"")), far).unwrap_err();
        assert!(e.contains("is not of the last 15 minutes by the gate's clock"), "{e}");
    }
    assert_eq!(seconds("20150830T+1+2+3Z"), None, "digits only");
    let twice = headers(&[
        ("x-amz-date", "20150830T123600Z"),
        ("x-amz-date", "20150830T123600Z"),
        ("authorization", VANILLA),
    ]);
    let r = head("GET", "/", None, &twice);
    assert!(verify(&r, &sig, SECRET, Some(&hash(b"")), SUITE).unwrap_err().contains("x-amz-date twice"));
    assert_eq!(seconds("19700101T000000Z"), Some(0));
    assert_eq!(seconds("20240229T235959Z"), Some(1_709_251_199));
    assert_eq!(seconds("20240229T235960Z"), Some(1_709_251_200), "a leap second is a date");
    assert_eq!(seconds("20240229T230000Z"), Some(1_709_247_600));
    for bad in [
        "20241301T000000Z",
        "20240001T000000Z",
        "20240132T000000Z",
        "20240100T000000Z",
        "20240101T240000Z",
        "20240101T006000Z",
        "20240101T000061Z",
        "19691231T235959Z",
    ] {
        assert_eq!(seconds(bad), None, "{bad}");
    }
}

#[test]
fn a_path_s3_would_spell_otherwise_and_a_query_read_two_ways_are_refused() {
    assert!(canonical_path("/bucket/dir/a%20file.txt") && canonical_path("/a-b_c.~/"));
    for odd in ["/b/k!x", "/b/a%2a", "/b/a%2", "/b/é", "/b/a b", "/a%20!", "/%41/%42!"] {
        assert!(!canonical_path(odd), "{odd}");
    }
    // A presigned S3 request over a path S3 would encode: not verified in the form it was sent.
    let q = "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request\
             &X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host\
             &X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404";
    let h = headers(&[]);
    let r = Head { host: "examplebucket.s3.amazonaws.com", ..head("GET", "/test!.txt", Some(q), &h) };
    let e = verify(&r, &parse(&r).unwrap().unwrap(), "x", None, S3_EXAMPLE).unwrap_err();
    assert!(e.contains("its path is not in AWS's encoding"), "{e}");
    // Nor as it goes upstream (a rule's spelling): S3 would read another request than signed.
    let sig = parse(&r).unwrap().unwrap();
    let v = Variant { normalised: false, payload: UNSIGNED.into() };
    let e = resign(&r, &sig, &v, REAL, PLACEHOLDER, S3_EXAMPLE).unwrap_err();
    assert!(e.contains("as it goes upstream is not in AWS's encoding"), "{e}");
    for query in ["a=b+c", "a=%zz", "a=%4"] {
        assert!(canonical_query(Some(query), Form::Header).unwrap_err().contains("another way"), "{query}");
    }
    assert!(canonical_query(Some("a=%4a"), Form::Header).is_ok());
}

#[test]
fn a_presigned_url_signed_again_is_good_for_fifteen_minutes_at_most() {
    let q = format!(
        "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={}%2F20261205%2Fus-east-1%2Fs3%2Faws4_request\
         &X-Amz-Date=20261205T101500Z&X-Amz-Expires=604800&X-Amz-SignedHeaders=host&X-Amz-Signature={}",
        PLACEHOLDER.key_id,
        "0".repeat(64)
    );
    let h = headers(&[]);
    let r = head("GET", "/bucket/key", Some(&q), &h);
    let sig = parse(&r).unwrap().unwrap();
    let v = Variant { normalised: false, payload: UNSIGNED.into() };
    let creds = Creds { token: None, ..REAL };
    let Resigned::Query { query, .. } =
        resign(&r, &sig, &v, creds, Creds { token: None, ..PLACEHOLDER }, NOW).unwrap()
    else {
        panic!()
    };
    assert!(query.contains("X-Amz-Expires=900&"), "{query}");
    // Signed ten minutes into its window: what is left of it.
    let Resigned::Query { query, .. } =
        resign(&r, &sig, &v, creds, Creds { token: None, ..PLACEHOLDER }, NOW + 600).unwrap()
    else {
        panic!()
    };
    assert!(query.contains("X-Amz-Expires=300&"), "{query}");
    // An auth parameter spelled twice, or in another case, is refused.
    for odd in [format!("{q}&X-Amz-Expires=60"), q.replace("X-Amz-Expires", "x-amz-expires")] {
        let r = head("GET", "/bucket/key", Some(&odd), &h);
        let e = resign(&r, &sig, &v, creds, Creds { token: None, ..PLACEHOLDER }, NOW).unwrap_err();
        assert!(e.contains("X-Amz-Expires twice or otherwise"), "{e}");
    }
    // Control: a shorter expiry is kept.
    let short = q.replace("604800", "60");
    let r = head("GET", "/bucket/key", Some(&short), &h);
    let Resigned::Query { query, .. } =
        resign(&r, &sig, &v, creds, Creds { token: None, ..PLACEHOLDER }, NOW).unwrap()
    else {
        panic!()
    };
    assert!(query.contains("X-Amz-Expires=60&"), "{query}");
}

#[test]
fn a_presigned_url_needs_no_body_and_a_header_signature_its_hash() {
    let h = headers(&[]);
    let q = "X-Amz-Signature=00";
    let r = head("GET", "/", Some(q), &h);
    let sig = Signature {
        form: Form::Query,
        key_id: "k".into(),
        scope: "20261205/us-east-1/s3/aws4_request".into(),
        amz_date: "20261205T101500Z".into(),
        signed: vec!["host".into()],
        hex: "0".repeat(64),
    };
    assert!(!needs_body(&r, &sig), "a presigned S3 URL signs no body");
    assert_eq!(payloads(&r, &sig, None).unwrap(), [UNSIGNED]);
    assert_eq!(payloads(&r, &sig, Some("h")).unwrap(), [UNSIGNED], "S3's form, whatever else could match");
    // Another service's presigned URL signs its body's hash.
    let sts = Signature { scope: "20261205/us-east-1/sts/aws4_request".into(), ..sig.clone() };
    assert!(needs_body(&r, &sts));
    assert_eq!(payloads(&r, &sts, Some("h")).unwrap(), ["h"]);
    assert!(payloads(&r, &sts, None).is_err());
    let header = Signature { form: Form::Header, ..sig.clone() };
    assert!(needs_body(&r, &header));
    assert_eq!(payloads(&r, &header, Some("h")).unwrap(), ["h"]);
    assert!(payloads(&r, &header, None).is_err());
    let hashed = headers(&[("x-amz-content-sha256", "abc")]);
    let r = head("PUT", "/", None, &hashed);
    assert!(!needs_body(&r, &header));
    assert_eq!(payloads(&r, &header, Some("h")).unwrap(), ["abc"], "the client's own hash is what it signed");
    assert_eq!(spaced_hex("AK", false), "41 4b");
    assert_eq!(spaced_hex("AK", true), "41 4B");
}

#[test]
fn a_presigned_url_whose_signed_header_is_gone_is_not_signed_again_and_an_empty_path_is_slash() {
    let q = format!(
        "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={}%2F20261205%2Fus-east-1%2Fs3%2Faws4_request\
         &X-Amz-Date=20261205T101500Z&X-Amz-Expires=60&X-Amz-SignedHeaders=host%3Bx-amz-meta-a&X-Amz-Signature={}",
        PLACEHOLDER.key_id,
        "0".repeat(64)
    );
    let with = headers(&[("x-amz-meta-a", "1")]);
    let r = head("GET", "/bucket/key", Some(&q), &with);
    let sig = parse(&r).unwrap().unwrap();
    assert_eq!(sig.signed, ["host", "x-amz-meta-a"]);
    let v = Variant { normalised: false, payload: UNSIGNED.into() };
    let (real, ph) = (Creds { token: None, ..REAL }, Creds { token: None, ..PLACEHOLDER });
    assert!(resign(&r, &sig, &v, real, ph, NOW).is_ok(), "its signed header is there");
    let without = headers(&[]);
    let r = head("GET", "/bucket/key", Some(&q), &without);
    assert!(
        resign(&r, &sig, &v, real, ph, NOW)
            .unwrap_err()
            .contains("a header its presigned URL signs is not in the request")
    );
    let h = headers(&[]);
    let cr = canonical(&head("GET", "", None, &h), &v, "", "host:h\n", "host");
    assert!(cr.starts_with("GET\n/\n\n"), "{cr}");
}
