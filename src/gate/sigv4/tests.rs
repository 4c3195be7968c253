use super::*;

/// The credentials of AWS's published examples.
const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";

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
    let v = verify(&r, &sig, SECRET, Some(b"")).expect("AWS's own example verifies");
    assert!(!v.normalised, "`/` is the same either way: the first form is taken");
    assert!(verify(&r, &sig, "another-secret", Some(b"")).is_err());
    // The date is signed: another one does not verify.
    let h2 = headers(&[("x-amz-date", "20150830T123601Z"), ("authorization", VANILLA)]);
    assert!(verify(&head("GET", "/", None, &h2), &sig, SECRET, Some(b"")).is_err());
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
    assert!(verify(&r, &sig, SECRET, Some(b"")).is_ok());
    assert_eq!(canonical_query(Some("b=%2f&a=x%3Ay&c"), Form::Header), "a=x%3Ay&b=%2F&c=");
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
    let v =
        verify(&r, &sig, "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", Some(b"")).expect("AWS's S3 example");
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
    let v = Variant { normalised: true, payload: hex(digest::digest(&digest::SHA256, body).as_ref()) };
    let hdrs = canonical_headers(&r, &names, |_, v| Ok(v.to_string())).unwrap();
    let cr = canonical(&r, &v, &canonical_query(None, Form::Header), &hdrs, &names.join(";"));
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
    let v = verify(&r, &sig, PLACEHOLDER.secret, Some(body)).expect("signed with the placeholders");
    assert!(v.normalised, "the path was signed encoded once more");
    assert!(verify(&r, &sig, PLACEHOLDER.secret, Some(b"another body")).is_err(), "the body is signed");
    let Resigned::Header { authorization, token, hex } = resign(&r, &sig, &v, REAL, PLACEHOLDER).unwrap()
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
    assert_eq!(verify(&up, &upsig, REAL.secret, Some(body)).unwrap(), v);
    assert!(verify(&up, &upsig, PLACEHOLDER.secret, Some(body)).is_err());
}

#[test]
fn a_header_the_gate_took_out_leaves_the_signed_list_and_a_foreign_token_is_refused() {
    let path = "/model/m/invoke";
    let mut h = signed_by(PLACEHOLDER, path, b"", true);
    let r = head("POST", path, None, &h);
    let sig = parse(&r).unwrap().unwrap();
    let v = verify(&r, &sig, PLACEHOLDER.secret, Some(b"")).unwrap();
    h.remove("content-type");
    let Resigned::Header { authorization, .. } =
        resign(&head("POST", path, None, &h), &sig, &v, REAL, PLACEHOLDER).unwrap()
    else {
        panic!()
    };
    assert!(authorization.contains("SignedHeaders=host;x-amz-date;x-amz-security-token,"), "{authorization}");
    h.insert("x-amz-security-token", "someone-elses-token".parse().unwrap());
    let err = resign(&head("POST", path, None, &h), &sig, &v, REAL, PLACEHOLDER).unwrap_err();
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
    let cr = canonical(&unsigned, &v, &canonical_query(Some(&q), Form::Query), &hdrs, "host");
    let q = format!("{q}&X-Amz-Signature={}", sign(PLACEHOLDER.secret, &sig.scope, &sig.amz_date, &cr));
    let r = head("GET", "/bucket/key", Some(&q), &h);
    let sig = parse(&r).unwrap().unwrap();
    let v = verify(&r, &sig, PLACEHOLDER.secret, Some(b"")).unwrap();
    let Resigned::Query { query, .. } = resign(&r, &sig, &v, REAL, PLACEHOLDER).unwrap() else { panic!() };
    assert!(!query.contains("aisb_placeholder_"), "{query}");
    assert!(query.contains("X-Amz-Credential=ASIAREALKEYID0000001%2F20261205"), "{query}");
    assert!(
        query.contains(&format!("X-Amz-Security-Token={}", encode(REAL.token.unwrap(), false))),
        "{query}"
    );
    let up = head("GET", "/bucket/key", Some(&query), &h);
    let upsig = parse(&up).unwrap().unwrap();
    assert!(verify(&up, &upsig, REAL.secret, Some(b"")).is_ok());
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
    assert!(verify(&r, &sig, SECRET, None).unwrap_err().contains("chunk by chunk"));
    // A date not of the scope's day.
    let h = headers(&[("x-amz-date", "20150831T123600Z"), ("authorization", VANILLA)]);
    let r = head("GET", "/", None, &h);
    assert!(verify(&r, &parse(&r).unwrap().unwrap(), SECRET, Some(b"")).unwrap_err().contains("scope's day"));
}

#[test]
fn dot_segments_and_empty_segments_go_from_the_path() {
    assert_eq!(remove_dot_segments("/a/./b/../c//d/"), "/a/c/d/");
    assert_eq!(remove_dot_segments("/"), "/");
    assert_eq!(remove_dot_segments("/../.."), "/");
    assert_eq!(encode("a b/%3A~", true), "a%20b/%253A~");
    assert_eq!(encode("a/b", false), "a%2Fb");
}
