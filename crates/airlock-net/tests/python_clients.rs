//! Real Python clients (urllib and requests) find the proxy through the
//! environment a sandbox gets, and reach loopback servers only through it.
//! Needs `python3` with `requests` installed (`pip install requests`).

mod common;

use std::process::Command;
use std::sync::Arc;

use airlock_net::{StaticResolver, proxy_environment};
use airlock_policy::NetworkVerdict;
use common::*;

const CLIENTS: &str = r#"
import json, sys, urllib.error, urllib.request
import requests

http_url, https_url, refused_http, refused_https = sys.argv[1:5]
out = {}
out["urllib_http"] = urllib.request.urlopen(http_url + "urllib", timeout=10).read().decode()
out["urllib_https"] = urllib.request.urlopen(https_url + "urllib", timeout=10).read().decode()
out["requests_http"] = requests.get(http_url + "requests", timeout=10).text
out["requests_https"] = requests.get(https_url + "requests", timeout=10).text
try:
    urllib.request.urlopen(refused_http, timeout=10)
    out["urllib_refused_http"] = "fetched"
except urllib.error.HTTPError as e:
    out["urllib_refused_http"] = e.code
out["requests_refused_http"] = requests.get(refused_http, timeout=10).status_code
try:
    requests.get(refused_https, timeout=10)
    out["requests_refused_https"] = "fetched"
except requests.exceptions.ProxyError as e:
    out["requests_refused_https"] = "403" if "403" in str(e) else str(e)
try:
    urllib.request.urlopen(refused_https, timeout=10)
    out["urllib_refused_https"] = "fetched"
except OSError as e:
    out["urllib_refused_https"] = "403" if "403" in str(e) else str(e)
print(json.dumps(out))
"#;

#[test]
fn urllib_and_requests_go_through_the_proxy_and_only_where_allowed() {
    let ca = TestCa::new();
    let http = Server::http();
    let https = Server::https(&ca);
    let elsewhere = Server::http();
    let rules = [format!("127.0.0.1:{}", http.port()), format!("127.0.0.1:{}", https.port())];
    let (proxy, addr) = start_proxy(&rules, Arc::new(StaticResolver::new()), Caps::default());

    let output = Command::new("python3")
        .args(["-c", CLIENTS])
        .arg(format!("http://127.0.0.1:{}/", http.port()))
        .arg(format!("https://127.0.0.1:{}/", https.port()))
        .arg(format!("http://127.0.0.1:{}/refused", elsewhere.port()))
        .arg(format!("https://127.0.0.1:{}/refused", elsewhere.port()))
        .envs(proxy_environment(addr))
        .env("SSL_CERT_FILE", ca.ca_file())
        .env("REQUESTS_CA_BUNDLE", ca.ca_file())
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .env_remove("CURL_CA_BUNDLE")
        .output()
        .unwrap_or_else(|e| panic!("python3 is needed for this test (with `pip install requests`): {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "python failed (is `requests` installed?)\n{stdout}\n{stderr}");

    let expected = serde_json::json!({
        "urllib_http": "hello from /urllib",
        "urllib_https": "hello from /urllib",
        "requests_http": "hello from /requests",
        "requests_https": "hello from /requests",
        "urllib_refused_http": 403,
        "requests_refused_http": 403,
        "requests_refused_https": "403",
        "urllib_refused_https": "403",
    });
    let got: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(got, expected);

    assert_eq!(elsewhere.connections(), 0);
    let events = proxy.finish().record.connections;
    // Every request went through the proxy: two allowed per server, four refused.
    let allowed = allowed(&events);
    assert_eq!(allowed.len(), 4, "{events:?}");
    assert_eq!(allowed.iter().filter(|e| e.port == http.port()).count(), 2);
    assert_eq!(allowed.iter().filter(|e| e.port == https.port()).count(), 2);
    let refused: Vec<_> = events.iter().filter(|e| e.verdict == NetworkVerdict::Denied).collect();
    assert_eq!(refused.len(), 4, "{events:?}");
    assert!(refused.iter().all(|e| e.port == elsewhere.port()));
    http.settle(2);
    https.settle(2);
    assert_eq!(http.requests().len(), 2);
    assert_eq!(https.requests().len(), 2);
}
