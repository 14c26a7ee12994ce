//! Data in and out: only named files, under /work, capped, never through a
//! link the sandbox planted, and never blocking on what it left there.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use airlock::{Limit, Output, Policy, RunRequest, SandboxPath, Status};
use airlock_tests::sandbox;

fn out(path: &str, save_to: Option<&std::path::Path>) -> Output {
    Output { path: SandboxPath::parse(path).unwrap(), save_to: save_to.map(Into::into), inline: true }
}

#[test]
fn copy_in_refuses_paths_outside_work() {
    let mut sb = sandbox(Policy::default());
    for bad in ["../etc/passwd", "/work/../etc/x", "/etc/passwd", "", "/work", "/workshop/x", "a/../../b"] {
        let err = sb.write(bad, b"x").unwrap_err().to_string();
        assert!(err.contains("/work") || err.contains("empty") || err.contains(".."), "{bad:?}: {err}");
    }
    sb.write("data/in.csv", b"a,b\n").unwrap();
    let record = sb.run_request(&RunRequest::shell("cat /work/data/in.csv"));
    assert_eq!(record.stdout, "a,b\n");
    assert_eq!(record.inputs.len(), 1);
    assert_eq!(record.inputs[0].path, "/work/data/in.csv");
    assert_eq!(record.inputs[0].bytes, 4);
}

#[test]
fn copy_in_never_follows_a_planted_link_or_blocks_on_a_fifo() {
    let host = tempfile::tempdir().unwrap();
    let victim = host.path().join("victim");
    std::fs::write(&victim, "untouched").unwrap();
    let mut sb = sandbox(Policy::default());
    let record = sb.run_request(&RunRequest::shell(format!(
        "ln -s {} /work/link; mkdir /work/d; ln -s /etc /work/dirlink; mkfifo /work/fifo",
        victim.display()
    )));
    assert_eq!(record.status, Status::Ok, "{record:?}");
    let err = sb.write("/work/link", b"overwritten").unwrap_err().to_string();
    assert!(err.contains("link"), "{err}");
    let err = sb.write("/work/dirlink/passwd", b"x").unwrap_err().to_string();
    assert!(err.contains("link"), "{err}");
    let started = Instant::now();
    let err = sb.write("/work/fifo", b"x").unwrap_err().to_string();
    assert!(started.elapsed() < Duration::from_secs(2), "blocked on a FIFO");
    assert!(!err.is_empty());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
}

#[test]
fn copy_in_is_capped_per_file_and_in_total() {
    let mut policy = Policy::default();
    policy.limits.file_bytes = 1000;
    policy.limits.files_total_bytes = 1500;
    let mut sb = sandbox(policy);
    assert!(sb.write("a", &[0; 1001]).unwrap_err().to_string().contains("max_file_bytes"));
    sb.write("a", &[0; 1000]).unwrap();
    assert!(sb.write("b", &[0; 600]).unwrap_err().to_string().contains("max_files_total_bytes"));
    sb.write("b", &[0; 500]).unwrap();
}

#[test]
fn copy_out_reads_regular_files_and_writes_plain_0644_files() {
    let host = tempfile::tempdir().unwrap();
    let dest = host.path().join("out.json");
    let mut sb = sandbox(Policy::default());
    let record = sb.run_request(&RunRequest {
        outputs: vec![out("/work/out.json", Some(&dest))],
        ..RunRequest::python(
            "open('/work/out.json', 'w').write('{\"x\": 1}')\nimport os\nos.chmod('/work/out.json', 0o4777)",
        )
    });
    let artifact = &record.artifacts[0];
    assert_eq!(artifact.error, None, "{record:?}");
    assert_eq!(artifact.bytes, Some(8));
    assert_eq!(std::fs::read_to_string(&dest).unwrap(), "{\"x\": 1}");
    let mode = std::fs::metadata(&dest).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o644, "a plain file, whatever mode the sandbox set");
    assert_eq!(sb.read("/work/out.json").unwrap(), b"{\"x\": 1}");
}

#[test]
fn copy_out_refuses_links_fifos_directories_and_oversized_files() {
    let host = tempfile::tempdir().unwrap();
    let secret = host.path().join("secret");
    std::fs::write(&secret, "host secret").unwrap();
    let mut policy = Policy::default();
    policy.limits.file_bytes = 1000;
    let mut sb = sandbox(policy);
    let started = Instant::now();
    let record = sb.run_request(&RunRequest {
        outputs: ["link", "fifo", "dir", "big", "exact", "missing", "sub/escape"]
            .iter()
            .map(|p| out(p, None))
            .collect(),
        ..RunRequest::shell(format!(
            "ln -s {s} /work/link; mkfifo /work/fifo; mkdir /work/dir; head -c 1001 /dev/zero > /work/big; \
             head -c 1000 /dev/zero > /work/exact; ln -s / /work/sub",
            s = secret.display()
        ))
    });
    assert!(started.elapsed() < Duration::from_secs(5), "copy-out blocked");
    let error = |p: &str| {
        record
            .artifacts
            .iter()
            .find(|a| a.path == format!("/work/{p}"))
            .and_then(|a| a.error.clone())
            .unwrap_or_default()
    };
    assert!(error("link").contains("link"), "{}", error("link"));
    assert!(error("fifo").contains("FIFO"), "{}", error("fifo"));
    assert!(error("dir").contains("directory"), "{}", error("dir"));
    assert!(error("big").contains("1001 bytes"), "one byte over is refused, not cut: {}", error("big"));
    assert!(error("exact").is_empty(), "exactly the cap is fine: {}", error("exact"));
    assert!(error("missing").contains("does not exist"));
    assert!(error("sub/escape").contains("link"), "{}", error("sub/escape"));
    assert!(record.limits_hit.contains(&Limit::Artifacts));
    for a in &record.artifacts {
        assert!(a.content_base64.as_deref().unwrap_or("") != "aG9zdCBzZWNyZXQ=", "the host secret came out");
    }
}

#[test]
fn a_file_swapped_for_a_link_while_the_run_ends_never_leaks() {
    let host = tempfile::tempdir().unwrap();
    let secret = host.path().join("secret");
    std::fs::write(&secret, "host secret").unwrap();
    for _ in 0..5 {
        let mut sb = sandbox(Policy::default());
        let record = sb.run_request(&RunRequest {
            outputs: vec![out("/work/out.txt", None)],
            ..RunRequest::shell(format!(
                "echo data > /work/real; (while :; do ln -sf {} /work/out.txt; cp /work/real /work/out.txt.tmp; \
                 mv -f /work/out.txt.tmp /work/out.txt; done) & sleep 0.05",
                secret.display()
            ))
        });
        let a = &record.artifacts[0];
        match &a.error {
            Some(e) => assert!(e.contains("link") || e.contains("not exist"), "{e}"),
            None => assert_eq!(a.content_base64.as_deref(), Some("ZGF0YQo="), "only the sandbox's own data"),
        }
    }
}

#[test]
fn artifacts_together_are_capped() {
    let mut policy = Policy::default();
    policy.limits.file_bytes = 1000;
    policy.limits.files_total_bytes = 1500;
    let mut sb = sandbox(policy);
    let record = sb.run_request(&RunRequest {
        outputs: vec![out("a", None), out("b", None)],
        ..RunRequest::shell("head -c 1000 /dev/zero > /work/a; head -c 600 /dev/zero > /work/b")
    });
    assert_eq!(record.artifacts[0].error, None);
    assert!(record.artifacts[1].error.as_deref().unwrap_or("").contains("together"), "{:?}", record.artifacts[1]);
}
