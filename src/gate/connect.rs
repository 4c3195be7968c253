//! `ai-sandbox connect HOST PORT`: a ProxyCommand for ssh (and anything that wants a raw TCP
//! stream) inside the sandbox. It opens a CONNECT tunnel through the egress gate, with the
//! session token from the proxy variables (never from the command line), and then relays
//! stdin/stdout over it. So `git@github.com:…` works with `allow = github.com:22` under the same
//! allowlist, token and decision log as HTTPS; a refusal prints the gate's hint on stderr, which
//! ssh shows.

use anyhow::{Context, bail};
use base64::Engine;
use std::io::{Read, Write};
use std::net::TcpStream;

/// The gate's address and the session token, from `http://aisb:TOKEN@ADDR:PORT`.
pub(crate) fn parse_proxy_url(url: &str) -> Option<(String, String)> {
    let rest = url.strip_prefix("http://")?;
    let (userinfo, hostport) = rest.trim_end_matches('/').split_once('@')?;
    let (_, token) = userinfo.split_once(':')?;
    (!token.is_empty() && hostport.contains(':')).then(|| (hostport.to_string(), token.to_string()))
}

pub fn run(host: &str, port: u16) -> anyhow::Result<i32> {
    let url = ["HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"]
        .iter()
        .find_map(|k| std::env::var(k).ok())
        .context(
            "no proxy variables: `ai-sandbox connect` runs inside a sandbox that uses the egress gate",
        )?;
    let (gate, token) = parse_proxy_url(&url).context("the proxy variable is not the egress gate's URL")?;
    let mut s =
        TcpStream::connect(&gate).with_context(|| format!("connecting to the egress gate at {gate}"))?;
    let cred = base64::engine::general_purpose::STANDARD.encode(format!("aisb:{token}"));
    let target = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
    write!(s, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {cred}\r\n\r\n")?;
    // The response head, byte by byte: nothing after it may be consumed here.
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    let (status, reason) = loop {
        if s.read(&mut b)? == 0 || head.len() > 16 * 1024 {
            bail!("the egress gate closed the connection to {target}");
        }
        head.push(b[0]);
        match crate::gate::http::response_head(&head) {
            Ok(None) => {}
            Ok(Some((status, reason, _))) => break (status, reason),
            Err(e) => bail!("the egress gate's answer for {target} is not HTTP ({e})"),
        }
    };
    if status != 200 {
        let mut body = String::new();
        let _ = s.read_to_string(&mut body);
        eprintln!("ai-sandbox connect {target}: {status} {reason}\n{}", body.trim_end());
        return Ok(1);
    }
    let mut up = s.try_clone()?;
    let to_remote = std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut up);
        let _ = up.shutdown(std::net::Shutdown::Write);
    });
    // Not `io::copy` into stdout: stdout is line-buffered, and ssh's binary packets would wait
    // for a newline that never comes. Every chunk is flushed as it arrives.
    let mut out = std::io::stdout().lock();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        out.write_all(&buf[..n])?;
        out.flush()?;
    }
    drop(to_remote);
    Ok(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_gate_url_gives_address_and_token() {
        assert_eq!(
            super::parse_proxy_url("http://aisb:abc123@100.64.0.1:18081"),
            Some(("100.64.0.1:18081".into(), "abc123".into()))
        );
        assert_eq!(super::parse_proxy_url("http://100.64.0.1:18081"), None);
        assert_eq!(super::parse_proxy_url("http://aisb:@100.64.0.1:18081"), None);
        assert_eq!(super::parse_proxy_url("socks5://aisb:t@h:1"), None);
    }
}
