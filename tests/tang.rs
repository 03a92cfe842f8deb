//! Tang protectors (network-bound unlock) against Debian's real `tangd` and `clevis` (tang 11,
//! clevis 19), on 127.0.0.1: tangd is started once per connection, as its systemd socket unit
//! does, by a listener in this test; its keys are made by `tangd-keygen` in a temporary directory.
//! Proves: create (pinned thumbprint; unpinned refused off a terminal; a wrong one refused),
//! unlock while the server answers and a clear "unreachable" error naming the other ways in when it
//! does not, an impostor's answer and changed server keys refused (rotated ones kept working),
//! `clevis decrypt` of the record's JWE gives the key that wraps the protector key, a JWE made by
//! `clevis encrypt tang` imports and unlocks, no login tries it, and a portable directory refuses
//! it.
mod common;

use std::fs;
use std::net::TcpListener;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use common::{p, Env, FAST_CONFIG};

const TANGD: &str = "/usr/libexec/tangd";
const KEYGEN: &str = "/usr/libexec/tangd-keygen";

fn need(prog: &str) {
    assert!(
        Path::new(prog).exists() || Command::new("sh").args(["-c", &format!("command -v {prog}")]).output().is_ok_and(|o| o.status.success()),
        "{prog} is missing: install Debian's tang and clevis packages (scripts/deps.sh does: apt-get install tang clevis)"
    );
}

/// A tang server on 127.0.0.1: each connection runs `tangd DIR` on it.
struct Tang {
    keys: tempfile::TempDir,
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Tang {
    fn start() -> Tang {
        for prog in [TANGD, KEYGEN, "clevis", "jose"] {
            need(prog);
        }
        let keys = tempfile::tempdir().unwrap();
        let out = Command::new(KEYGEN).arg(keys.path()).output().unwrap();
        assert!(out.status.success(), "tangd-keygen: {}", String::from_utf8_lossy(&out.stderr));
        let mut t = Tang { keys, port: 0, stop: Arc::new(AtomicBool::new(false)), thread: None };
        t.listen(0);
        t
    }

    fn listen(&mut self, port: u16) {
        let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
        listener.set_nonblocking(true).unwrap();
        self.port = listener.local_addr().unwrap().port();
        self.stop = Arc::new(AtomicBool::new(false));
        let (stop, dir) = (self.stop.clone(), self.keys.path().to_path_buf());
        self.thread = Some(std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        conn.set_nonblocking(false).unwrap();
                        let out = OwnedFd::from(conn.try_clone().unwrap());
                        let mut child = Command::new(TANGD)
                            .arg(&dir)
                            .stdin(Stdio::from(OwnedFd::from(conn)))
                            .stdout(Stdio::from(out))
                            .stderr(Stdio::null())
                            .spawn()
                            .expect("start tangd");
                        std::thread::spawn(move || child.wait());
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        }));
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The signing key's SHA-256 thumbprint, as `tang-show-keys` prints it.
    fn thumbprint(&self) -> String {
        let files = fs::read_dir(self.keys.path()).unwrap().map(|e| e.unwrap().path());
        for f in files.filter(|f| !f.file_name().unwrap().to_string_lossy().starts_with('.')) {
            let jwk: serde_json::Value = serde_json::from_slice(&fs::read(&f).unwrap()).unwrap();
            if jwk["alg"] == "ES512" {
                let out = Command::new("jose").args(["jwk", "thp", "-a", "S256", "-i", p(&f)]).output().unwrap();
                return String::from_utf8(out.stdout).unwrap().trim().to_string();
            }
        }
        panic!("no signing key in {}", self.keys.path().display())
    }

    /// Stops answering: the port refuses connections.
    fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }

    /// Answers again on the same port.
    fn restart(&mut self) {
        self.listen(self.port);
    }

    /// Replaces the server's keys with new ones (a reinstalled server, or another one).
    fn new_keys(&self) {
        for e in fs::read_dir(self.keys.path()).unwrap() {
            fs::remove_file(e.unwrap().path()).unwrap();
        }
        let out = Command::new(KEYGEN).arg(self.keys.path()).output().unwrap();
        assert!(out.status.success());
    }
}

impl Drop for Tang {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A server on `port` that answers one request with a fresh P-521 public key of its own, as a
/// tang server's exchange reply looks.
fn impostor(port: u16) -> JoinHandle<()> {
    use std::io::{Read, Write};
    let gen = Command::new("jose").args(["jwk", "gen", "-i", r#"{"alg":"ECMR","crv":"P-521"}"#]).output().unwrap();
    let mut key: serde_json::Value = serde_json::from_slice(&gen.stdout).unwrap();
    key.as_object_mut().unwrap().remove("d");
    let body = key.to_string();
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
    std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        // The request's headers and its JWK body (the body ends with the JSON's closing brace).
        while !got.ends_with(b"}") {
            let n = conn.read(&mut buf).unwrap();
            assert!(n > 0, "the client closed early");
            got.extend_from_slice(&buf[..n]);
        }
        assert!(got.starts_with(b"POST /rec/"), "{}", String::from_utf8_lossy(&got));
        let reply = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/jwk+json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        conn.write_all(reply.as_bytes()).unwrap();
    })
}

fn protectors(env: &Env) -> Vec<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_str(&env.ok(&["protector", "list", "--json"], "")).unwrap();
    v["protectors"].as_array().unwrap().clone()
}

fn id_of(env: &Env, name: &str) -> String {
    let list = protectors(env);
    let r = list.iter().find(|r| r["name"] == name).unwrap_or_else(|| panic!("no protector {name}: {list:?}"));
    r["id"].as_str().unwrap().to_string()
}

fn record(env: &Env, id: &str) -> serde_json::Value {
    serde_json::from_slice(&fs::read(env.keystore().join("protectors").join(format!("{id}.json"))).unwrap()).unwrap()
}

/// An encrypted directory `d` holding `f`, opened by password protector "pw" (password "pw").
fn encrypted(env: &Env) -> PathBuf {
    let d = env.mnt().join("lab");
    fs::create_dir(&d).unwrap();
    env.ok(&["encrypt", p(&d), "--protector-name", "pw", "--no-recovery-key"], "pw\n");
    fs::write(d.join("f"), b"lab data").unwrap();
    d
}

fn clevis(args: &[&str], stdin: &[u8]) -> std::process::Output {
    use std::io::Write;
    let mut c = Command::new("clevis")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("clevis (scripts/deps.sh installs it)");
    c.stdin.take().unwrap().write_all(stdin).unwrap();
    c.wait_with_output().unwrap()
}

#[test]
fn a_tang_protector_unlocks_only_while_its_server_answers_with_its_key() {
    dirseal_testfs::needs_root!();
    let mut tang = Tang::start();
    let env = Env::new();
    let d = encrypted(&env);
    let (url, thp) = (tang.url(), tang.thumbprint());

    // Off a terminal an unpinned server is not trusted: the keys to compare are named.
    let err = env.fails(&["protector", "create", "--name", "lab", "--type", "tang", "--url", &url], "");
    assert!(err.contains("needs confirmation") && err.contains("--thumbprint") && err.contains(&thp), "{err}");
    // A thumbprint that did not sign the advertisement is refused.
    let other = "A".repeat(43);
    let err = env
        .fails(&["protector", "create", "--name", "lab", "--type", "tang", "--url", &url, "--thumbprint", &other], "");
    assert!(err.contains(&format!("not signed by the trusted key {other}")) && err.contains(&thp), "{err}");
    assert_eq!(protectors(&env).len(), 1, "nothing saved by a refused create");

    env.ok(&["protector", "create", "--name", "lab", "--type", "tang", "--url", &url, "--thumbprint", &thp], "");
    let (lab, pw) = (id_of(&env, "lab"), id_of(&env, "pw"));
    env.ok(&["policy", "add-protector", p(&d), "--protector", &lab], "pw\n");

    // The record: a clevis JWE naming the server, nothing else.
    let rec = record(&env, &lab);
    assert_eq!(rec["kind"].as_object().unwrap().keys().collect::<Vec<_>>(), ["jwe", "type"]);
    let jwe = rec["kind"]["jwe"].as_str().unwrap().to_string();

    // Unlocks with nothing typed (no input given) while the server answers.
    env.ok(&["lock", p(&d)], "");
    env.ok(&["unlock", p(&d), "--protector", &lab], "");
    assert_eq!(fs::read(d.join("f")).unwrap(), b"lab data");

    // `clevis decrypt` of the record's JWE gives the key that wraps the protector key: it opens
    // the record's wrapped key under the record's associated data (docs/formats.md).
    let out = clevis(&["decrypt"], jwe.as_bytes());
    assert!(out.status.success(), "clevis decrypt: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout.len(), 32);
    let nonce = hex::decode(rec["wrapped_key"]["nonce"].as_str().unwrap()).unwrap();
    let sealed = hex::decode(rec["wrapped_key"]["ciphertext"].as_str().unwrap()).unwrap();
    let aad = format!("dirseal:1:protector:{lab}:tang:{jwe}");
    let opened = Aes256Gcm::new_from_slice(&out.stdout)
        .unwrap()
        .decrypt(Nonce::from_slice(&nonce), Payload { msg: &sealed, aad: aad.as_bytes() });
    assert_eq!(opened.expect("clevis's key opens the protector key").len(), 32);

    // The server stopped: a clear error, with the directory's other way in.
    env.ok(&["lock", p(&d)], "");
    tang.stop();
    let err = env.fails(&["unlock", p(&d), "--protector", &lab], "");
    assert!(err.contains(&format!("the network server (tang) at {url} is unreachable")), "{err}");
    assert!(err.contains("check the network and that the server runs"), "{err}");
    assert!(err.contains(&format!("protector pw (password, {pw})")), "{err}");
    // Without --protector the tang protector is tried first, then the password is asked.
    let out = env.run(&["unlock", p(&d)], "pw\n");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("is unreachable"), "{said}");
    env.ok(&["lock", p(&d)], "");

    // Something else answers on the server's port, with a point of its own: refused.
    let fake = impostor(tang.port);
    let err = env.fails(&["unlock", p(&d), "--protector", &lab], "");
    assert!(err.contains("answered with a key that does not open this protector"), "{err}");
    fake.join().unwrap();

    // The server back, its keys rotated (`tangd-rotate-keys` keeps the old ones, hidden): the
    // protector still opens, and the new signing key is the one advertised.
    tang.restart();
    let out = Command::new("/usr/libexec/tangd-rotate-keys").args(["-d", p(tang.keys.path())]).output().unwrap();
    assert!(out.status.success(), "tangd-rotate-keys: {}", String::from_utf8_lossy(&out.stderr));
    assert_ne!(tang.thumbprint(), thp);
    env.ok(&["unlock", p(&d), "--protector", &lab], "");
    env.ok(&["lock", p(&d)], "");

    // The server with other keys only: its answer cannot open the protector, and the old
    // thumbprint no longer signs its advertisement.
    tang.new_keys();
    let err = env.fails(&["unlock", p(&d), "--protector", &lab], "");
    assert!(err.contains("no longer has the key this protector was made with"), "{err}");
    let err = env
        .fails(&["protector", "create", "--name", "lab2", "--type", "tang", "--url", &url, "--thumbprint", &thp], "");
    assert!(err.contains(&format!("not signed by the trusted key {thp}")), "{err}");
    // The password still opens it.
    env.ok(&["unlock", p(&d), "--protector", &pw], "pw\n");
    assert_eq!(fs::read(d.join("f")).unwrap(), b"lab data");
}

#[test]
fn a_jwe_from_clevis_encrypt_imports_and_unlocks() {
    dirseal_testfs::needs_root!();
    let tang = Tang::start();
    let env = Env::new();
    let d = encrypted(&env);
    let cfg = format!(r#"{{"url":"{}","thp":"{}"}}"#, tang.url(), tang.thumbprint());
    let key: [u8; 32] = std::array::from_fn(|i| (i * 7 + 3) as u8);
    let out = clevis(&["encrypt", "tang", &cfg], &key);
    assert!(out.status.success(), "clevis encrypt: {}", String::from_utf8_lossy(&out.stderr));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lab.jwe");
    fs::write(&file, &out.stdout).unwrap();

    env.ok(&["protector", "create", "--name", "imported", "--type", "tang", "--import", p(&file)], "");
    let id = id_of(&env, "imported");
    // Kept as clevis wrote it.
    assert_eq!(record(&env, &id)["kind"]["jwe"].as_str().unwrap(), String::from_utf8(out.stdout).unwrap().trim());
    env.ok(&["policy", "add-protector", p(&d), "--protector", &id], "pw\n");
    env.ok(&["lock", p(&d)], "");
    env.ok(&["unlock", p(&d), "--protector", &id], "");
    assert_eq!(fs::read(d.join("f")).unwrap(), b"lab data");

    // A JWE whose plaintext is no 32-byte key is refused, saying how to make one.
    let out = clevis(&["encrypt", "tang", &cfg], b"short");
    fs::write(&file, &out.stdout).unwrap();
    let err = env.fails(&["protector", "create", "--name", "short", "--type", "tang", "--import", p(&file)], "");
    assert!(err.contains("holds 5 bytes") && err.contains("head -c 32 /dev/urandom"), "{err}");
    // Something that is not a clevis tang JWE.
    fs::write(&file, "not.a.jwe").unwrap();
    let err = env.fails(&["protector", "create", "--name", "bad", "--type", "tang", "--import", p(&file)], "");
    assert!(err.contains("not a clevis tang JWE"), "{err}");
}

#[test]
fn a_tang_protector_opens_no_login_and_no_portable_directory() {
    dirseal_testfs::needs_root!();
    use dirseal::keystore::PolicyRecord;
    use dirseal::ops::{Dirseal, NewProtector};
    use dirseal::protector::{KindOptions, NewKind};
    use dirseal_testfs::ui::Scripted;
    let tang = Tang::start();
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("config.toml"), FAST_CONFIG).unwrap();
    let mut ds = Dirseal::open(&dir.path().join("config.toml"), Some(&dir.path().join("ks"))).unwrap();
    // No thumbprint: the Ui is shown the server's signing key and asked, as clevis asks.
    let opts = KindOptions::new(vec![("url".into(), tang.url())]);
    let n = NewProtector { name: "lab".into(), uid: Some(4242), kind: NewKind::named("tang", opts).unwrap() };
    let mut ui = Scripted::new(&[]).yes();
    let (lab, lab_key) = ds.create_protector(&n, &mut ui).unwrap();
    assert_eq!(ui.asked.len(), 1, "{:?}", ui.asked);
    assert!(ui.asked[0].contains("TrustTangServer") && ui.asked[0].contains(&tang.thumbprint()), "{:?}", ui.asked);
    assert!(!lab.kind.travels() && !lab.kind.opens_login());
    // Refused when nobody confirms.
    let opts = KindOptions::new(vec![("url".into(), tang.url())]);
    let n2 = NewProtector { name: "no".into(), uid: None, kind: NewKind::named("tang", opts).unwrap() };
    let e = ds.create_protector(&n2, &mut Scripted::new(&[])).err().expect("unconfirmed: refused");
    assert!(e.to_string().contains("were not confirmed"), "{e}");
    // A server URL is an administrator's option (the machine talks to it).
    let opts = KindOptions::untrusted(vec![("url".into(), tang.url())]);
    assert!(NewKind::named("tang", opts).unwrap_err().to_string().contains("only by an administrator"));

    // The user's own tang protector is no login protector: their password is.
    let pw = NewProtector { name: "pw".into(), uid: Some(4242), kind: NewKind::login_default() };
    let (pw, pw_key) = ds.create_protector(&pw, &mut Scripted::new(&["pw"])).unwrap();
    let mut policy = PolicyRecord::new(dirseal::ids::KeyIdentifier([7; 16]), None);
    let master = dirseal::secret::MasterKey::random();
    policy.add_protector(&lab.id, &lab_key, &master);
    policy.add_protector(&pw.id, &pw_key, &master);
    let login: Vec<String> = ds.login_protectors(&policy, 4242).into_iter().map(|r| r.name).collect();
    assert_eq!(login, ["pw"]);

    // A portable directory refuses it before anything is made.
    let env = Env::new();
    let d = env.mnt().join("card");
    fs::create_dir(&d).unwrap();
    let (url, thp) = (tang.url(), tang.thumbprint());
    let err = env.fails(
        &[
            "encrypt",
            p(&d),
            "--portable",
            "--protector-type",
            "tang",
            "--url",
            &url,
            "--thumbprint",
            &thp,
            "--no-recovery-key",
        ],
        "",
    );
    assert!(err.contains("bound to this machine"), "{err}");
    assert_eq!(env.status_json(&d)["encrypted"], false);
}

/// The opt-in boot unit's command: `unlock-at-boot` opens the directories `[tang] unlock_at_boot`
/// names with their tang protectors only, asking nothing; one without a tang protector, or whose
/// server does not answer, stays locked with its reason, and the exit status tells the unit to
/// try again.
#[test]
fn unlock_at_boot_opens_the_marked_directories_with_their_tang_protectors_only() {
    dirseal_testfs::needs_root!();
    let mut tang = Tang::start();
    let env = Env::new();
    let lab = encrypted(&env);
    let (url, thp) = (tang.url(), tang.thumbprint());
    env.ok(&["protector", "create", "--name", "net", "--type", "tang", "--url", &url, "--thumbprint", &thp], "");
    env.ok(&["policy", "add-protector", p(&lab), "--protector", "net"], "pw\n");
    let home = env.mnt().join("home");
    fs::create_dir(&home).unwrap();
    env.ok(&["encrypt", p(&home), "--protector-name", "hers", "--no-recovery-key"], "pw2\n");
    let out = env.ok(&["unlock-at-boot"], "");
    assert!(out.contains("no directory is marked"), "{out}");
    let mut config = fs::read_to_string(env.config()).unwrap();
    config.push_str(&format!("\n[tang]\nunlock_at_boot = [\"{}\", \"{}\"]\n", p(&lab), p(&home)));
    fs::write(env.config(), &config).unwrap();
    env.ok(&["lock", p(&lab)], "");
    env.ok(&["lock", p(&home)], "");

    // A password is typed in the input, and never read: only machine keys are tried.
    let out = env.run(&["unlock-at-boot"], "pw2\n");
    let (said, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{said}{err}");
    assert!(said.contains(&format!("{}: unlocked", p(&lab))), "{said}");
    assert!(
        err.contains(&format!("{}: still locked", p(&home))) && err.contains("no network (tang) protector"),
        "{err}"
    );
    assert_eq!(fs::read(lab.join("f")).unwrap(), b"lab data");
    assert_eq!(env.status_json(&home)["key"], "locked");
    assert_eq!(env.status_json(&lab)["key"], "unlocked");

    // Again: nothing asked of the server for an open directory.
    tang.stop();
    let out = env.run(&["unlock-at-boot"], "");
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("{}: already unlocked", p(&lab))));
    // The server gone: still locked, said why, exit 1 (the unit tries again).
    env.ok(&["lock", p(&lab)], "");
    let out = env.run(&["unlock-at-boot"], "");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("{}: still locked", p(&lab))) && err.contains("is unreachable"), "{err}");
    assert_eq!(env.status_json(&lab)["key"], "locked");
    tang.restart();
    let out = env.run(&["unlock-at-boot"], "");
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("{}: unlocked", p(&lab))));
    assert_eq!(fs::read(lab.join("f")).unwrap(), b"lab data");

    // Only absolute paths mark a directory.
    fs::write(env.config(), config.replace(&format!("\"{}\"", p(&lab)), "\"srv/lab\"")).unwrap();
    let err = env.fails(&["unlock-at-boot"], "");
    assert!(err.contains("[tang] unlock_at_boot: srv/lab is not an absolute path"), "{err}");
}
