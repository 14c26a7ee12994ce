//! Image builds attacked: a package index the test serves itself on
//! 127.0.0.1 (a folder of wheels the test makes), so no test needs the
//! network. A poisoned wheel, a package with an import-time side effect, a
//! lock without hashes, extra packages outside the vetted set and a tampered
//! image, each against the real build: uv in a sandbox behind the egress
//! proxy, the host checking every hash.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use airlock::image::{BuildOptions, ImageStore, PackageIndex};
use airlock::{Error, Policy, Sandbox, SandboxOptions, Status};
use airlock_tests::{linux, test_home};
use base64::Engine;

/// A pure-Python wheel: its files, with the metadata and RECORD a wheel needs.
fn wheel(name: &str, version: &str, files: &[(&str, &str)]) -> (String, Vec<u8>) {
    use zip::write::SimpleFileOptions;
    let file_name = format!("{name}-{version}-py3-none-any.whl");
    let info = format!("{name}-{version}.dist-info");
    let mut all: Vec<(String, String)> = files.iter().map(|(p, c)| ((*p).to_owned(), (*c).to_owned())).collect();
    all.push((format!("{info}/METADATA"), format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")));
    all.push((
        format!("{info}/WHEEL"),
        "Wheel-Version: 1.0\nGenerator: airlock-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n".to_owned(),
    ));
    let mut record = String::new();
    for (path, content) in &all {
        let digest = airlock_core::sha256_hex(content.as_bytes());
        let raw: Vec<u8> =
            (0..digest.len() / 2).map(|i| u8::from_str_radix(&digest[2 * i..2 * i + 2], 16).unwrap()).collect();
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw);
        record.push_str(&format!("{path},sha256={b64},{}\n", content.len()));
    }
    record.push_str(&format!("{info}/RECORD,,\n"));
    all.push((format!("{info}/RECORD"), record));
    let mut out = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (path, content) in &all {
        out.start_file(path.as_str(), SimpleFileOptions::default()).unwrap();
        out.write_all(content.as_bytes()).unwrap();
    }
    (file_name, out.finish().unwrap().into_inner())
}

/// A simple index (PEP 503) on 127.0.0.1: `/simple/<project>/` lists the
/// files of the folder whose name starts with the project's, `/files/<name>`
/// serves one. Every request path is kept, for the test to check.
struct Index {
    port: u16,
    dir: PathBuf,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Index {
    fn serve(dir: &Path) -> Index {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (seen, root) = (requests.clone(), dir.to_owned());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (seen, root) = (seen.clone(), root.clone());
                std::thread::spawn(move || answer(stream, &root, &seen));
            }
        });
        Index { port, dir: dir.to_owned(), requests }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/simple", self.port)
    }

    fn file_url(&self, file_name: &str) -> String {
        format!("http://127.0.0.1:{}/files/{file_name}", self.port)
    }

    fn put(&self, file_name: &str, content: &[u8]) {
        std::fs::write(self.dir.join(file_name), content).unwrap();
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

fn answer(stream: TcpStream, root: &Path, seen: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).map_or(true, |n| n == 0) || header == "\r\n" {
            break;
        }
    }
    // The proxy forwards in origin form; a direct client might send either.
    let target = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let path = target.split_once("://").map_or(target.as_str(), |(_, rest)| &rest[rest.find('/').unwrap_or(0)..]);
    seen.lock().unwrap().push(path.to_owned());
    let files: Vec<String> =
        std::fs::read_dir(root).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    let (status, body, kind) = if let Some(project) = path.strip_prefix("/simple/") {
        let project = project.trim_end_matches('/').replace('-', "_");
        let links: String = files
            .iter()
            .filter(|f| f.to_lowercase().starts_with(&format!("{project}-")))
            .map(|f| format!("<a href=\"/files/{f}\">{f}</a>\n"))
            .collect();
        ("200 OK", format!("<html><body>\n{links}</body></html>\n").into_bytes(), "text/html")
    } else if let Some(name) = path.strip_prefix("/files/").filter(|n| files.iter().any(|f| f == n)) {
        ("200 OK", std::fs::read(root.join(name)).unwrap(), "application/octet-stream")
    } else {
        ("404 Not Found", b"not here\n".to_vec(), "text/plain")
    };
    let mut stream = stream;
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(&body));
}

/// A lock (pylock.toml) pinning each `(name, version, file name, content)`.
fn lock(index: &Index, packages: &[(&str, &str, &str, &[u8])]) -> String {
    let mut text = "lock-version = \"1.0\"\ncreated-by = \"airlock-tests\"\n".to_owned();
    for (name, version, file_name, content) in packages {
        text.push_str(&format!(
            "\n[[packages]]\nname = \"{name}\"\nversion = \"{version}\"\nwheels = [{{ name = \"{file_name}\", url = \"{}\", size = {}, hashes = {{ sha256 = \"{}\" }} }}]\n",
            index.file_url(file_name),
            content.len(),
            airlock_core::sha256_hex(content)
        ));
    }
    text
}

/// The pinned uv wheel, from the cache of the python-data build (made from
/// PyPI once, through the sandboxed path, by `airlock_tests::data_image`):
/// the local index serves it as PyPI would.
fn uv_wheel() -> (String, Vec<u8>) {
    airlock_tests::data_image();
    let files = test_home().join("images/.cache/files");
    for entry in std::fs::read_dir(&files).unwrap().flatten() {
        for file in std::fs::read_dir(entry.path()).unwrap().flatten() {
            let name = file.file_name().to_string_lossy().into_owned();
            if name.starts_with(&format!("uv-{}-", airlock::image::UV_VERSION)) && name.ends_with(".whl") {
                return (name, std::fs::read(file.path()).unwrap());
            }
        }
    }
    panic!("no uv wheel in {}", files.display());
}

/// A store of its own, fetching from its own local index that serves uv.
fn setup() -> (tempfile::TempDir, Index, ImageStore) {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("index")).unwrap();
    let index = Index::serve(&root.path().join("index"));
    let (uv_name, uv) = uv_wheel();
    index.put(&uv_name, &uv);
    let store = ImageStore::at(root.path().join("images"))
        .with_backend(linux())
        .with_index(PackageIndex::parse(&index.url(), "the test").unwrap());
    (root, index, store)
}

fn options(lock: String) -> BuildOptions {
    BuildOptions { lock, ..BuildOptions::default_image() }
}

/// What the store holds besides its bookkeeping: image folders, builds
/// under way, downloads arriving.
fn leftovers(store_root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(store_root).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "names" || name == ".cache" || name.ends_with(".lock") {
            continue;
        }
        found.push(name);
    }
    let cache = store_root.join(".cache/files");
    for entry in std::fs::read_dir(&cache).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            found.push(format!(".cache/files/{name}"));
        }
    }
    found
}

/// Code that, run at interpreter start-up (a .pth) or import, reports that
/// it ran and tries to leave `marker` on the host.
fn side_effect(marker: &Path) -> String {
    format!(
        "import sys\nprint('side effect ran in', sys.prefix, flush=True)\n\
         for path in [{marker:?}, '/tmp/airlock-image-side-effect']:\n    try:\n        open(path, 'w').write('ran')\n    except OSError:\n        pass\n",
        marker = marker.display().to_string()
    )
}

#[test]
fn a_poisoned_wheel_is_refused_before_any_of_its_code_runs_and_nothing_is_left() {
    let (root, index, store) = setup();
    let marker = root.path().join("poisoned-ran");
    let (file, good) = wheel("poisoned", "1.0", &[("poisoned/__init__.py", "")]);
    let code = side_effect(&marker);
    let (_, evil) = wheel("poisoned", "1.0", &[("poisoned/__init__.py", &code), ("poisoned.pth", "import poisoned\n")]);
    index.put(&file, &evil);
    let lock = lock(&index, &[("poisoned", "1.0", &file, &good)]);

    let err = store.build("poisoned", &options(lock), &mut |_| {}).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::HashMismatch { .. }), "{text}");
    for needle in ["package poisoned", &airlock_core::sha256_hex(&good), &airlock_core::sha256_hex(&evil)] {
        assert!(text.contains(needle), "{needle:?} missing from: {text}");
    }
    assert!(index.requests().iter().any(|r| r == &format!("/files/{file}")), "{:?}", index.requests());
    assert!(!marker.exists(), "the poisoned wheel's code ran on the host");
    assert!(!Path::new("/tmp/airlock-image-side-effect").exists());
    assert!(matches!(store.get("poisoned"), Err(Error::ImageMissing { .. })));
    assert_eq!(leftovers(&root.path().join("images")), Vec::<String>::new());
    let cached: Vec<String> = walk(&root.path().join("images/.cache/files"));
    assert!(!cached.iter().any(|f| f.contains("poisoned")), "{cached:?}");
}

#[test]
fn a_package_with_an_import_side_effect_runs_only_inside_the_sandbox() {
    let (root, index, store) = setup();
    let marker = root.path().join("side-effect-ran");
    let code = side_effect(&marker);
    let (file, content) =
        wheel("sideeffect", "1.0", &[("sideeffect/__init__.py", &code), ("sideeffect.pth", "import sideeffect\n")]);
    index.put(&file, &content);
    let lock = lock(&index, &[("sideeffect", "1.0", &file, &content)]);

    let built = store.build("side", &options(lock), &mut |_| {}).unwrap();
    assert!(!built.reused);
    let install = built.records.last().unwrap();
    assert!(
        install.stdout.contains("side effect ran in /opt/airlock/image"),
        "the package's start-up code ran in the install step's sandbox: {install:?}"
    );
    assert!(!marker.exists(), "the package's code wrote {} on the host", marker.display());
    assert!(!Path::new("/tmp/airlock-image-side-effect").exists());
    let names: Vec<&str> = built.image.manifest.packages.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["sideeffect"]);

    // Every step's network went to the index, by its exact address, and nowhere else.
    let mut hosts = std::collections::BTreeSet::new();
    for record in &built.records {
        for connection in record.network.iter().flat_map(|n| n.connections.iter()) {
            hosts.insert(format!("{}:{}", connection.host, connection.port));
        }
    }
    assert_eq!(hosts.into_iter().collect::<Vec<_>>(), [format!("127.0.0.1:{}", index.port)]);
    let download = &built.records[0];
    assert_eq!(download.network.as_ref().unwrap().allowed_hosts, [format!("127.0.0.1:{}", index.port)]);

    // Built again: the same inputs give the same image, at no cost.
    let served = index.requests().len();
    let again = store.build("side", &options(built_lock(&store, "side")), &mut |_| {}).unwrap();
    assert!(again.reused && again.records.is_empty());
    assert_eq!(again.image.manifest.hash, built.image.manifest.hash);
    assert_eq!(index.requests().len(), served, "a cached rebuild fetched nothing");
}

fn built_lock(store: &ImageStore, name: &str) -> String {
    std::fs::read_to_string(store.get(name).unwrap().dir.join("lock.toml")).unwrap()
}

#[test]
fn a_lock_with_a_missing_hash_is_refused_before_anything_is_fetched() {
    let (root, index, store) = setup();
    let (file, content) = wheel("nohash", "1.0", &[("nohash/__init__.py", "")]);
    index.put(&file, &content);
    let lock = lock(&index, &[("nohash", "1.0", &file, &content)]);
    let lock =
        lock.replace(&format!("hashes = {{ sha256 = \"{}\" }}", airlock_core::sha256_hex(&content)), "hashes = {}");
    let text = store.build("nohash", &options(lock), &mut |_| {}).unwrap_err().to_string();
    assert!(text.contains("\"nohash\"") && text.contains("no sha256"), "{text}");
    assert_eq!(index.requests(), Vec::<String>::new());
    assert_eq!(leftovers(&root.path().join("images")), Vec::<String>::new());
}

#[test]
fn extra_packages_come_only_from_the_vetted_set_built_once_and_cached() {
    let (root, index, store) = setup();
    let (base_file, base) = wheel("basepkg", "1.0", &[("basepkg/__init__.py", "")]);
    let (extra_file, extra) = wheel("extrapkg", "2.0", &[("extrapkg/__init__.py", "VALUE = 42\n")]);
    let (other_file, other) = wheel("otherpkg", "1.0", &[("otherpkg/__init__.py", "")]);
    for (f, c) in [(&base_file, &base), (&extra_file, &extra), (&other_file, &other)] {
        index.put(f, c);
    }
    store.build("tiny", &options(lock(&index, &[("basepkg", "1.0", &base_file, &base)])), &mut |_| {}).unwrap();
    store.vet("tiny", &lock(&index, &[("extrapkg", "2.0", &extra_file, &extra)])).unwrap();
    let image = store.get("tiny").unwrap();

    let err = store.with_packages(&image, &["otherpkg".to_owned()], &mut |_| {}).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, Error::NotVetted { .. }) && text.contains("otherpkg") && text.contains("extrapkg 2.0"),
        "{text}"
    );
    assert!(!index.requests().iter().any(|r| r.contains("otherpkg")));

    let first = store.with_packages(&image, &["extrapkg".to_owned()], &mut |_| {}).unwrap();
    assert!(!first.cached && !first.records.is_empty());
    let second = store.with_packages(&image, &["ExtraPkg".to_owned()], &mut |_| {}).unwrap();
    assert!(second.cached && second.records.is_empty());
    assert_eq!(second.image.manifest.hash, first.image.manifest.hash);

    // A run asks for it: the derived image, no network in the run, the cost in its usage.
    let policy = Policy { with_packages: ["extrapkg".to_owned()].into(), ..Policy::default() };
    let mut sandbox = Sandbox::with_options(SandboxOptions {
        policy,
        image: Some("tiny".to_owned()),
        images: Some(store.clone()),
        backend: Some(linux()),
        ..SandboxOptions::default()
    })
    .unwrap();
    let record = sandbox.run("import extrapkg, basepkg; print(extrapkg.VALUE)");
    assert_eq!((record.status, record.stdout.trim()), (Status::Ok, "42"), "{record:?}");
    assert_eq!(record.usage.image_cached, Some(true));
    assert!(record.usage.image_ms.is_some());
    assert!(record.network.is_none(), "{:?}", record.network);
    drop(root);
}

#[test]
fn verify_names_a_tampered_file_and_a_changed_manifest_is_refused() {
    let (root, index, store) = setup();
    let (file, content) = wheel("plainpkg", "1.0", &[("plainpkg/__init__.py", "VALUE = 1\n")]);
    index.put(&file, &content);
    let built =
        store.build("plain", &options(lock(&index, &[("plainpkg", "1.0", &file, &content)])), &mut |_| {}).unwrap();
    assert!(store.verify("plain").unwrap().is_clean());

    let module = walk(&built.image.dir).into_iter().find(|p| p.ends_with("plainpkg/__init__.py")).unwrap();
    std::fs::write(built.image.dir.join(&module), "import os; os.system('id')\n").unwrap();
    std::fs::write(built.image.dir.join("venv/planted.py"), "").unwrap();
    let found = store.verify("plain").unwrap();
    assert!(found.changed.iter().any(|p| p.ends_with("plainpkg/__init__.py")), "{found:?}");
    assert!(found.added.iter().any(|p| p.ends_with("venv/planted.py")), "{found:?}");

    let manifest = built.image.dir.join("manifest.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, text.replace("plainpkg", "plainpkx")).unwrap();
    let err = store.get("plain").unwrap_err().to_string();
    assert!(err.contains("manifest was changed"), "{err}");
    drop(root);
}

/// Every file below `dir`, relative to it.
fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(path);
            } else {
                out.push(path.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out
}
