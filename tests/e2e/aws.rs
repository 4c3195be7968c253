//! AWS credentials the gate signs with (`secret = aws for HOST`, ADR 0088): a real AWS client
//! (boto3, pinned in scripts/install-test-tools) in the sandbox, holding only placeholders,
//! calls a fake AWS endpoint that verifies every SigV4 signature with botocore's own signer
//! (tests/e2e/fake_aws.py, under the real hostnames): Bedrock's InvokeModel (a body the gate
//! hashes, a path the signer encodes twice), S3's PutObject and GetObject (the client's payload
//! hash, an aws-chunked upload) and a presigned S3 URL (the query form). Each succeeds through
//! the gate. The controls: the same client's request sent to the endpoint under a name the gate
//! only tunnels is rejected by the endpoint itself (the placeholders' own signature does not
//! pass: the gate's signing is what does); sent to another host the gate opens, it is refused
//! as an exfiltration attempt; the placeholder of the secret key is refused even to its own
//! host. The real credentials are read from a credentials file's profile, and are in no
//! process's command line or environment and nowhere in the sandbox HOME while it runs.

use crate::harness::*;
use crate::logins::files_containing;
use std::ffi::OsStr;

/// The boto3 venv of scripts/install-test-tools (readable by the test user; an `image = host`
/// sandbox sees /opt).
const AWS_PYTHON: &str = "/opt/aisb-aws/bin/python";

const BEDROCK: &str = "bedrock-runtime.us-east-1.amazonaws.com";
const S3: &str = "s3.us-east-1.amazonaws.com";
/// The fake under a name the gate tunnels (no secret bound): the client's own signature arrives.
const DIRECT: &str = "aws-direct.test";
/// The fake under a name another secret is bound to (the gate opens it).
const OTHER: &str = "other-api.test";

const MODEL: &str = "anthropic.claude-3-5-haiku-20241022-v1:0";

/// The client the sandbox runs: each call's outcome, as JSON, in `results.json`.
const CLIENT: &str = r#"
import json, os, sys, urllib.request
import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

MODEL = sys.argv[1]
out = {"key_id_seen": os.environ.get("AWS_ACCESS_KEY_ID", "")}
one = Config(retries={"max_attempts": 1, "mode": "standard"})
def status(call):
    try:
        call()
        return 200
    except ClientError as e:
        return e.response["ResponseMetadata"]["HTTPStatusCode"]

br = boto3.client("bedrock-runtime", region_name="us-east-1", config=one)
r = br.invoke_model(modelId=MODEL, body=json.dumps({"anthropic_version": "bedrock-2023-05-31", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}))
out["bedrock"] = json.loads(r["body"].read())
s3 = boto3.client("s3", region_name="us-east-1", endpoint_url="https://s3.us-east-1.amazonaws.com", config=one.merge(Config(s3={"addressing_style": "path"}, signature_version="s3v4")))
s3.put_object(Bucket="e2e", Key="dir/a file.txt", Body=b"held-by-the-gate")
out["get"] = s3.get_object(Bucket="e2e", Key="dir/a file.txt")["Body"].read().decode()
url = s3.generate_presigned_url("get_object", Params={"Bucket": "e2e", "Key": "dir/a file.txt"}, ExpiresIn=60)
out["presigned"] = urllib.request.urlopen(url).read().decode()
# Around the gate's signing: the endpoint under a name the gate only tunnels.
direct = boto3.client("bedrock-runtime", region_name="us-east-1", config=one, endpoint_url="https://aws-direct.test", verify="ca.pem")
out["direct"] = status(lambda: direct.invoke_model(modelId=MODEL, body="{}"))
# To another host the gate opens: the placeholder key id is not bound there.
other = boto3.client("bedrock-runtime", region_name="us-east-1", config=one, endpoint_url="https://other-api.test")
out["other"] = status(lambda: other.invoke_model(modelId=MODEL, body="{}"))
# The secret key's placeholder goes nowhere, not even to its own host.
leak = urllib.request.Request("https://bedrock-runtime.us-east-1.amazonaws.com/model/x/invoke", data=b"{}",
                              headers={"x-leak": os.environ["AWS_SECRET_ACCESS_KEY"]})
try:
    urllib.request.urlopen(leak)
    out["leak"] = 200
except urllib.error.HTTPError as e:
    out["leak"] = e.code
json.dump(out, open("results.json", "w"))
"#;

#[test]
#[ignore = "e2e: needs root + scripts/install-deps; run by scripts/test"]
fn an_aws_client_signs_with_placeholders_and_the_gate_signs_with_the_real_keys() {
    let id = std::process::id();
    let th = TestHost::new();
    let dir = env().root.join(format!("fake-aws-{}", th.ns));
    std::fs::create_dir_all(&dir).unwrap();
    test_ca(&dir, &[BEDROCK, S3, DIRECT, OTHER]);
    let (key_id, secret, token) = (
        format!("ASIAE2EREAL{id:09}"),
        format!("e2eRealSecret/{id}+AbCdEfGhIjKlMnOpQrStUv"),
        format!("IQoJb3JpZ2luX2VjE2e2eRealSessionToken{id}//zz=="),
    );
    let creds = dir.join("creds.json");
    std::fs::write(
        &creds,
        serde_json::json!({"key_id": key_id, "secret": secret, "token": token}).to_string(),
    )
    .unwrap();
    let log = dir.join("requests.jsonl");
    std::fs::write(&log, "").unwrap();
    let (cert, key) = (dir.join("leaf.pem"), dir.join("leaf.key"));
    let args = [cert.as_os_str(), key.as_os_str(), OsStr::new("443")];
    let vars = [("FAKE_AWS_LOG", log.as_os_str()), ("FAKE_AWS_CREDS_FILE", creds.as_os_str())];
    let mut server = interpreter_on_443(AWS_PYTHON, &th.ns, &dir, "fake_aws.py", &args, &vars);

    // The user's credentials file: a profile of it, as `aws configure` writes one.
    let file = env().root.join(format!("aws-credentials-{id}"));
    let text = format!(
        "[default]\naws_access_key_id = AKIANOTTHISONE\naws_secret_access_key = nope\n\n[e2e]\n\
         aws_access_key_id = {key_id}\naws_secret_access_key = {secret}\naws_session_token = {token}\n"
    );
    std::fs::write(&file, text).unwrap();
    chown_user(&file);
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();

    let p = Project::new("aws-signed");
    let mut config = String::new();
    for h in [BEDROCK, S3, DIRECT, OTHER] {
        config += &format!("resolve = {h}={}\nallow = {h}\n", th.v4);
    }
    config += &format!(
        "secret = aws:e2e for {BEDROCK}, {S3}\nsecret = OTHER_KEY for {OTHER}\nupstream_ca = {}\n",
        dir.join("ca.pem").display()
    );
    p.config(&config);
    std::fs::copy(dir.join("ca.pem"), p.path("ca.pem")).unwrap();
    std::fs::write(p.path("client.py"), CLIENT).unwrap();
    chown_user(&p.path("client.py"));
    chown_user(&p.path("ca.pem"));
    let script = format!("{AWS_PYTHON} client.py '{MODEL}' && touch ready; {UNTIL_DONE}");
    let child = spawn_sandbox_with_secret_env(
        &p,
        &["--", "sh", "-c", &script],
        &[("AWS_SHARED_CREDENTIALS_FILE", file.to_str().unwrap()), ("OTHER_KEY", "other-e2e-real-value")],
    );
    let ready = wait_for(120, || p.path("ready").exists());
    let reals = [key_id.as_str(), secret.as_str(), token.as_str()];
    let leaks = command_lines_containing(&reals);
    let in_environ: Vec<_> = procs_holding("environ", &reals).into_iter().map(|(proc, _)| proc).collect();
    // This project's sandbox HOME (`NAME-HASH` under the homes of every project).
    let homes = env().home.join(".local/share/ai-sandbox/homes");
    let mine = format!("{}-", p.dir.file_name().unwrap().to_str().unwrap());
    let in_home: Vec<_> = std::fs::read_dir(&homes)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(&mine)))
        .flat_map(|e| files_containing(&e.path(), &reals))
        .collect();
    let ps = sandbox(&p, &["ps"], &[]);
    std::fs::write(p.path("done"), "").unwrap();
    let out = child.wait_with_output();
    let requests = json_lines(&log);
    let all = format!(
        "ready: {ready}, {}\nstdout:\n{}\nstderr:\n{}\nrequests:\n{requests:#?}\nfake's stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(dir.join("server.err")).unwrap_or_default()
    );
    let _ = server.kill();
    let _ = server.wait();
    assert!(ready && out.status.success(), "{all}");
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p.path("results.json")).unwrap()).unwrap();

    // Positive: each call succeeded, verified by botocore at the endpoint with the real keys.
    assert_eq!(results["bedrock"]["content"][0]["text"], "FAKE-BEDROCK-DONE", "{results}\n{all}");
    assert_eq!(results["bedrock"]["model_seen"], MODEL, "{results}");
    assert_eq!(
        (results["get"].as_str(), results["presigned"].as_str()),
        (Some("held-by-the-gate"), Some("held-by-the-gate"))
    );
    let verified = |host: &str, auth: &str| {
        requests.iter().any(|r| {
            r["host"] == host && r["auth"] == auth && r["sig_ok"] == true && r["key_id"] == key_id.as_str()
        })
    };
    assert!(verified(BEDROCK, "header") && verified(S3, "header") && verified(S3, "query"), "{all}");
    let put = requests.iter().find(|r| r["method"] == "PUT").expect("the upload arrived");
    assert_eq!(
        put["payload_hash"], "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
        "boto3's upload, signed as it chose"
    );

    // Controls: the placeholders' own signature does not pass at the endpoint; the key id's
    // placeholder to another opened host and the secret key's anywhere are refused by the gate.
    let placeholder = results["key_id_seen"].as_str().unwrap();
    assert!(placeholder.starts_with("aisb_placeholder_"), "the sandbox holds a placeholder: {results}");
    assert_eq!(results["direct"], 403, "{results}");
    assert!(
        requests.iter().any(|r| r["host"] == DIRECT && r["sig_ok"] == false && r["key_id"] == placeholder),
        "the endpoint itself rejected the placeholders' signature: {all}"
    );
    assert_eq!((results["other"].clone(), results["leak"].clone()), (403.into(), 403.into()), "{results}");
    assert!(!requests.iter().any(|r| r["host"] == OTHER), "nothing reached {OTHER}: {all}");
    assert!(
        !requests.iter().any(|r| r["path"] == "/model/x/invoke"),
        "the secret key's placeholder went nowhere"
    );
    let log = gate_log();
    // The key id's or the session token's placeholder, whichever header the gate read first.
    let to_other = |name: &str| {
        log.contains(&format!("exfiltration attempt: the placeholder of {name} sent to {OTHER}"))
    };
    assert!(to_other("AWS_ACCESS_KEY_ID") || to_other("AWS_SESSION_TOKEN"), "{log}");
    assert!(
        log.contains(&format!(
            "exfiltration attempt: the placeholder of AWS_SECRET_ACCESS_KEY sent to {BEDROCK}"
        )),
        "{log}"
    );
    assert!(log.contains("signed by the gate with your AWS credentials"), "{log}");

    // The real credentials stayed with the gate.
    assert!(
        leaks.is_empty() && in_environ.is_empty(),
        "a real credential in /proc: {leaks:?} {in_environ:?}"
    );
    assert!(in_home.is_empty(), "a real credential in the sandbox HOME: {in_home:?}");
    assert!(!reals.iter().any(|r| log.contains(r)), "a real credential in the gate's log");
    assert!(
        ps.stdout.contains(&format!("  login aws: held by the gate, which signs for {BEDROCK}, {S3}\n")),
        "{}",
        ps.stdout
    );
    let _ = std::fs::remove_file(&file);
}
