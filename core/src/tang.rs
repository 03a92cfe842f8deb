//! Tang servers (clevis/tang's network-bound encryption): the advertisement, its signature, the
//! McCallum–Relyea exchange and the clevis JWE, all as clevis-encrypt-tang and clevis-decrypt-tang
//! do them, so a record's JWE opens with `clevis decrypt` and clevis's JWEs open here.
//!
//! The exchange: the server's exchange key is S = s·G (advertised, ECMR on P-521). Encrypting
//! picks e, stores E = e·G as the JWE's `epk` and derives the content key from Z = e·S (ECDH-ES,
//! concat KDF, A256GCM), then forgets e. Decrypting picks x, sends X = E + x·G, gets back
//! Y = s·X = Z + x·S, and takes Z = Y − x·S. The server sees only X, a random point: it learns
//! nothing of Z, and nothing secret is stored here.
//!
//! Network input is parsed here, in the calling (root) process, and kept minimal: one HTTP/1.1
//! request per connection, timeouts on connect and every read, a reply of at most
//! [`MAX_REPLY`] bytes, a status line, headers and a `Content-Length` body (or up to the close)
//! and nothing else, then strict JSON into typed structs. It is all safe Rust (no C parser, no
//! TLS library), which is what the hardware helpers exist to keep out of the caller; so no helper
//! process. Plain http is what tang serves: the advertisement is signed and the exchange reveals
//! nothing.
use std::fmt;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use p521::ecdsa::signature::Verifier;
use p521::elliptic_curve::sec1::{FromEncodedPoint, ToEncodedPoint};
use p521::elliptic_curve::Field;
use p521::{AffinePoint, EncodedPoint, FieldBytes, ProjectivePoint, Scalar};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

/// How long connecting to the server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one request may take in all, once connected.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// The largest reply read (headers and body): an advertisement with a few keys is 2-4 KiB.
pub const MAX_REPLY: usize = 64 << 10;
/// The length of a P-521 coordinate.
const COORD: usize = 66;
/// The length of the key a record's JWE holds (the protector's key-encryption key).
pub const KEY_LEN: usize = 32;

/// Why talking to a tang server, or reading a clevis JWE, failed.
#[derive(Debug, thiserror::Error)]
pub enum TangError {
    /// The URL is not `http://HOST[:PORT][/PATH]`.
    #[error("tang server URL {url:?}: {reason}")]
    BadUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The server did not answer (no route, refused, timed out, name unknown).
    #[error(
        "the network server (tang) at {url} is unreachable: {reason}; it must answer to unlock this protector: check the network and that the server runs, or open the directory another way"
    )]
    Unreachable {
        /// The server's URL.
        url: String,
        /// What the network said.
        reason: String,
    },
    /// The server answered with an HTTP error.
    #[error("the tang server at {url} refused {what}: HTTP {status}")]
    Status {
        /// The server's URL.
        url: String,
        /// What was asked ("the advertisement", "the key exchange").
        what: &'static str,
        /// The HTTP status.
        status: u16,
    },
    /// The server no longer holds the exchange key a JWE was made with (its keys were replaced).
    #[error(
        "the tang server at {url} no longer has the key this protector was made with (kid {kid}): its keys were changed or it is another server; open the directory another way and make a new tang protector"
    )]
    KeyGone {
        /// The server's URL.
        url: String,
        /// The exchange key's thumbprint.
        kid: String,
    },
    /// The server's answer is not what a tang server says.
    #[error("the tang server at {url} sent an unreadable reply: {reason}")]
    BadReply {
        /// The server's URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The advertisement's signatures do not verify.
    #[error("the advertisement of the tang server at {url} is not signed by its own signing keys; refused")]
    BadSignature {
        /// The server's URL.
        url: String,
    },
    /// The pinned signing key did not sign the advertisement.
    #[error(
        "the tang server at {url} is not signed by the trusted key {thumbprint} (it is signed by {}): a changed server key or another server; refused",
        signers.join(", ")
    )]
    Untrusted {
        /// The server's URL.
        url: String,
        /// The thumbprint that was to sign it.
        thumbprint: String,
        /// The thumbprints of the keys that sign it.
        signers: Vec<String>,
    },
    /// Nobody confirmed the server's signing keys.
    #[error(
        "the signing keys of the tang server at {url} were not confirmed ({}); nothing was made; give the thumbprint the server's tang-show-keys prints",
        thumbprints.join(", ")
    )]
    NotTrusted {
        /// The server's URL.
        url: String,
        /// The signing keys' thumbprints.
        thumbprints: Vec<String>,
    },
    /// The key the exchange gave does not open the JWE: the server answered with another key.
    #[error("the tang server at {url} answered with a key that does not open this protector: a changed server key or another server; refused")]
    WrongKey {
        /// The server's URL.
        url: String,
    },
    /// A JWE that is not a clevis tang JWE this can open.
    #[error("not a clevis tang JWE: {reason}")]
    BadJwe {
        /// What is wrong with it.
        reason: String,
    },
}

fn bad_jwe(reason: impl Into<String>) -> TangError {
    TangError::BadJwe { reason: reason.into() }
}

/// A tang server's URL: `http://HOST[:PORT][/PATH]`, kept as given (the JWE's `url`, as clevis
/// keeps it) and parsed for connecting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TangUrl {
    text: String,
    host: String,
    port: u16,
    path: String,
}

impl TangUrl {
    /// Parses `text`; https, user info, queries and fragments are refused.
    pub fn parse(text: &str) -> Result<TangUrl, TangError> {
        let bad = |reason| TangError::BadUrl { url: text.to_string(), reason };
        let rest = text.strip_prefix("http://").ok_or_else(|| {
            bad("it must start with http:// (tang serves plain HTTP: the advertisement is signed and the exchange reveals nothing)")
        })?;
        if text.len() > 2048 || text.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(bad("it is too long or holds spaces or control characters"));
        }
        if rest.contains(['?', '#', '@', '\\']) {
            return Err(bad("it may not hold a query, a fragment or user info"));
        }
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or_else(|| bad("an IPv6 address needs its closing ]"))?;
            (h, after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() || !host.chars().all(|c| c.is_ascii_alphanumeric() || ".-_:".contains(c)) {
            return Err(bad("it names no valid host"));
        }
        let port = match port {
            None => 80,
            Some(p) => {
                p.parse().ok().filter(|&p| p != 0).ok_or_else(|| bad("its port is not a number from 1 to 65535"))?
            }
        };
        Ok(TangUrl {
            text: text.to_string(),
            host: host.to_string(),
            port,
            path: path.trim_end_matches('/').to_string(),
        })
    }

    /// The URL as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    fn unreachable(&self, e: impl fmt::Display) -> TangError {
        TangError::Unreachable { url: self.text.clone(), reason: e.to_string() }
    }

    fn bad_reply(&self, reason: impl Into<String>) -> TangError {
        TangError::BadReply { url: self.text.clone(), reason: reason.into() }
    }

    /// One request (`path` under the URL's), its 200 reply's body; any other status is
    /// [`TangError::Status`] (the caller words a 404).
    fn request(&self, what: &'static str, path: &str, body: Option<&[u8]>) -> Result<Result<Vec<u8>, u16>, TangError> {
        let deadline = Instant::now() + CONNECT_TIMEOUT + REQUEST_TIMEOUT;
        let addrs = (self.host.as_str(), self.port).to_socket_addrs().map_err(|e| self.unreachable(e))?;
        let mut last = None;
        let mut stream = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let mut s = match (stream, last) {
            (Some(s), _) => s,
            (None, Some(e)) => return Err(self.unreachable(e)),
            (None, None) => return Err(self.unreachable("the host name has no address")),
        };
        let host = if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
        let method = if body.is_some() { "POST" } else { "GET" };
        let mut req =
            format!("{method} {}{path} HTTP/1.1\r\nHost: {host}:{}\r\nConnection: close\r\n", self.path, self.port);
        if let Some(b) = body {
            req.push_str(&format!("Content-Type: application/jwk+json\r\nContent-Length: {}\r\n", b.len()));
        }
        req.push_str("\r\n");
        let mut out = req.into_bytes();
        out.extend_from_slice(body.unwrap_or_default());
        s.set_write_timeout(Some(REQUEST_TIMEOUT)).map_err(|e| self.unreachable(e))?;
        s.write_all(&out).map_err(|e| self.unreachable(e))?;
        let mut reply = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(
                    self.unreachable(format!("no complete answer to {what} within {} s", REQUEST_TIMEOUT.as_secs()))
                );
            }
            s.set_read_timeout(Some(left)).map_err(|e| self.unreachable(e))?;
            let n = match s.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.unreachable(e)),
            };
            if n == 0 {
                break;
            }
            if reply.len() + n > MAX_REPLY {
                return Err(self.bad_reply(format!("longer than {MAX_REPLY} bytes")));
            }
            reply.extend_from_slice(&buf[..n]);
            if let Some(done) = complete(&reply) {
                reply.truncate(done);
                break;
            }
        }
        self.parse_reply(&reply)
    }

    /// A reply's status and body: the status line, headers (Content-Length, no chunks), the body.
    fn parse_reply(&self, reply: &[u8]) -> Result<Result<Vec<u8>, u16>, TangError> {
        let end = find(reply, b"\r\n\r\n").ok_or_else(|| self.bad_reply("the HTTP headers do not end"))?;
        let head = std::str::from_utf8(&reply[..end]).map_err(|_| self.bad_reply("the HTTP headers are not text"))?;
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let mut parts = status_line.splitn(3, ' ');
        let (version, code) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
        if !matches!(version, "HTTP/1.1" | "HTTP/1.0") || code.len() != 3 {
            return Err(
                self.bad_reply(format!("not an HTTP reply: {:?}", status_line.chars().take(80).collect::<String>()))
            );
        }
        let status: u16 = code.parse().map_err(|_| self.bad_reply("the HTTP status is not a number"))?;
        let mut length = None;
        for line in lines {
            let (name, value) = line.split_once(':').ok_or_else(|| self.bad_reply("a malformed HTTP header"))?;
            if name.eq_ignore_ascii_case("transfer-encoding") {
                return Err(self.bad_reply("a chunked reply (a tang server sends Content-Length)"));
            }
            if name.eq_ignore_ascii_case("content-length") {
                let n: usize = value.trim().parse().map_err(|_| self.bad_reply("a malformed Content-Length"))?;
                if length.is_some_and(|l| l != n) {
                    return Err(self.bad_reply("two different Content-Lengths"));
                }
                length = Some(n);
            }
        }
        let body = &reply[end + 4..];
        let body = match length {
            Some(n) if body.len() < n => return Err(self.bad_reply("the reply ended early")),
            Some(n) => &body[..n],
            None => body,
        };
        Ok(if status == 200 { Ok(body.to_vec()) } else { Err(status) })
    }

    /// The server's advertisement, verified: every signing key it lists signed it.
    pub fn advertisement(&self) -> Result<Advertisement, TangError> {
        let body = self.request("the advertisement", "/adv", None)?.map_err(|status| TangError::Status {
            url: self.text.clone(),
            what: "the advertisement",
            status,
        })?;
        Advertisement::verify(self, &body)
    }

    /// The exchange: sends X = E + x·G for the exchange key `kid`, returns the server's s·X.
    fn recover(&self, kid: &str, x_point: &AffinePoint) -> Result<AffinePoint, TangError> {
        let body = serde_json::to_vec(&Jwk::of(x_point).to_json_with(&[("alg", json!("ECMR"))])).expect("json");
        let reply = self.request("the key exchange", &format!("/rec/{kid}"), Some(&body))?.map_err(|status| {
            match status {
                // tangd answers 404 for a key it does not hold (and 400 for a kid it cannot read).
                404 | 400 => TangError::KeyGone { url: self.text.clone(), kid: kid.to_string() },
                status => TangError::Status { url: self.text.clone(), what: "the key exchange", status },
            }
        })?;
        let jwk: JwkJson = serde_json::from_slice(&reply).map_err(|e| self.bad_reply(e.to_string()))?;
        let jwk = Jwk::parse(&jwk).map_err(|e| self.bad_reply(e))?;
        jwk.point().map_err(|e| self.bad_reply(e))
    }
}

/// Where a complete reply ends, when its headers say (a Content-Length); `None`: read on.
fn complete(reply: &[u8]) -> Option<usize> {
    let end = find(reply, b"\r\n\r\n")?;
    let head = std::str::from_utf8(&reply[..end]).ok()?;
    let n: usize = head.split("\r\n").find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("content-length").then(|| v.trim().parse().ok())?
    })?;
    (reply.len() >= end + 4 + n).then_some(end + 4 + n)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A JWK as it travels: an EC public key (a private `d` is refused by the parsers).
#[derive(Deserialize)]
struct JwkJson {
    kty: String,
    crv: String,
    x: String,
    y: String,
    #[serde(default)]
    key_ops: Option<Vec<String>>,
    #[serde(default)]
    d: Option<Value>,
}

/// A P-521 public key, its coordinates checked to be a point of the curve.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Jwk {
    x: [u8; COORD],
    y: [u8; COORD],
    ops: Vec<String>,
}

impl Jwk {
    fn parse(j: &JwkJson) -> Result<Jwk, String> {
        if j.kty != "EC" || j.crv != "P-521" {
            return Err(format!("a {} {} key, not EC P-521", j.kty, j.crv));
        }
        if j.d.is_some() {
            return Err("a private key where a public one belongs".into());
        }
        let coord = |s: &str| -> Result<[u8; COORD], String> {
            let v = B64.decode(s).map_err(|e| format!("a coordinate is not base64url: {e}"))?;
            v.try_into().map_err(|_| "a coordinate is not 66 bytes".to_string())
        };
        let k = Jwk { x: coord(&j.x)?, y: coord(&j.y)?, ops: j.key_ops.clone().unwrap_or_default() };
        k.point()?;
        Ok(k)
    }

    fn of(p: &AffinePoint) -> Jwk {
        let e = p.to_encoded_point(false);
        let mut k = Jwk { x: [0; COORD], y: [0; COORD], ops: Vec::new() };
        // Invariant: every point made here is a product with a nonzero scalar or a checked sum,
        // not the identity, so it has coordinates.
        k.x.copy_from_slice(e.x().expect("not the identity"));
        k.y.copy_from_slice(e.y().expect("not the identity"));
        k
    }

    fn point(&self) -> Result<AffinePoint, String> {
        let e = EncodedPoint::from_affine_coordinates(
            FieldBytes::from_slice(&self.x),
            FieldBytes::from_slice(&self.y),
            false,
        );
        Option::from(AffinePoint::from_encoded_point(&e))
            .ok_or_else(|| "a key that is not a point of P-521".to_string())
    }

    /// RFC 7638's thumbprint, SHA-256 and base64url, as `jose jwk thp -a S256` and
    /// `tang-show-keys` print it.
    fn thumbprint(&self) -> String {
        let canon =
            format!(r#"{{"crv":"P-521","kty":"EC","x":"{}","y":"{}"}}"#, B64.encode(self.x), B64.encode(self.y));
        B64.encode(Sha256::digest(canon.as_bytes()))
    }

    fn to_json_with(&self, extra: &[(&str, Value)]) -> Value {
        let mut v = json!({"crv": "P-521", "kty": "EC", "x": B64.encode(self.x), "y": B64.encode(self.y)});
        for (k, x) in extra {
            v[*k] = x.clone();
        }
        v
    }
}

/// The keys a JWKSet lists (unreadable keys and other curves are left out, as clevis does when
/// it picks by use).
fn keys_of(set: &Value) -> Result<Vec<Jwk>, String> {
    let keys = set.get("keys").and_then(Value::as_array).ok_or("no list of keys")?;
    Ok(keys
        .iter()
        .filter_map(|k| serde_json::from_value::<JwkJson>(k.clone()).ok())
        .filter_map(|k| Jwk::parse(&k).ok())
        .collect())
}

/// A server's verified advertisement.
#[derive(Clone, Debug)]
pub struct Advertisement {
    /// The signed key set, as the JWE's `clevis.tang.adv` keeps it.
    keys: Value,
    signing: Vec<Jwk>,
    exchange: Jwk,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JwsSignature {
    protected: String,
    signature: String,
    /// Unprotected header parameters: allowed, never used.
    #[serde(default, rename = "header")]
    _unprotected: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Jws {
    payload: String,
    #[serde(default)]
    signatures: Vec<JwsSignature>,
    #[serde(default)]
    protected: Option<String>,
    #[serde(default)]
    signature: Option<String>,
    #[serde(default, rename = "header")]
    _unprotected: Option<serde::de::IgnoredAny>,
}

impl Advertisement {
    /// Parses a JWS (general or flattened JSON) and checks, as `jose jws ver -a` does for
    /// clevis, that every signing key it lists made one of its ES512 signatures.
    fn verify(url: &TangUrl, body: &[u8]) -> Result<Advertisement, TangError> {
        let bad = |r: String| url.bad_reply(format!("the advertisement: {r}"));
        let mut jws: Jws = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
        if let (Some(protected), Some(signature)) = (jws.protected.take(), jws.signature.take()) {
            jws.signatures.push(JwsSignature { protected, signature, _unprotected: None });
        }
        let payload = B64.decode(&jws.payload).map_err(|e| bad(e.to_string()))?;
        let keys: Value = serde_json::from_slice(&payload).map_err(|e| bad(e.to_string()))?;
        let all = keys_of(&keys).map_err(bad)?;
        let signing: Vec<Jwk> = all.iter().filter(|k| k.ops.iter().any(|o| o == "verify")).cloned().collect();
        let exchange = all
            .iter()
            .find(|k| k.ops.iter().any(|o| o == "deriveKey"))
            .cloned()
            .ok_or_else(|| bad("no exchange (deriveKey) key".into()))?;
        if signing.is_empty() {
            return Err(bad("no signing (verify) key".into()));
        }
        let signed_by = |k: &Jwk| {
            let Ok(point) = k.point() else { return false };
            let Ok(vk) = p521::ecdsa::VerifyingKey::from_affine(point) else { return false };
            jws.signatures.iter().any(|s| {
                let alg_ok = B64
                    .decode(&s.protected)
                    .ok()
                    .and_then(|h| serde_json::from_slice::<Value>(&h).ok())
                    .is_some_and(|h| h.get("alg") == Some(&json!("ES512")));
                let sig = B64.decode(&s.signature).ok().and_then(|b| p521::ecdsa::Signature::from_slice(&b).ok());
                let input = format!("{}.{}", s.protected, jws.payload);
                alg_ok && sig.is_some_and(|sig| vk.verify(input.as_bytes(), &sig).is_ok())
            })
        };
        if !signing.iter().all(signed_by) {
            return Err(TangError::BadSignature { url: url.text.clone() });
        }
        Ok(Advertisement { keys, signing, exchange })
    }

    /// The signing keys' thumbprints (SHA-256), as `tang-show-keys` prints them.
    pub fn thumbprints(&self) -> Vec<String> {
        self.signing.iter().map(Jwk::thumbprint).collect()
    }

    /// Refuses the advertisement unless the key `thumbprint` signed it.
    pub fn check_signer(&self, url: &TangUrl, thumbprint: &str) -> Result<(), TangError> {
        if self.thumbprints().iter().any(|t| t == thumbprint) {
            return Ok(());
        }
        Err(TangError::Untrusted {
            url: url.text.clone(),
            thumbprint: thumbprint.to_string(),
            signers: self.thumbprints(),
        })
    }
}

/// The content key, from the shared point's x coordinate: RFC 7518's concat KDF for ECDH-ES
/// in direct mode with A256GCM (no apu, no apv), one SHA-256 round.
fn content_key(z: &AffinePoint) -> Zeroizing<[u8; 32]> {
    let e = z.to_encoded_point(false);
    let mut h = Sha256::new();
    h.update(1u32.to_be_bytes());
    // Invariant: the points here are never the identity (see `Jwk::of`).
    h.update(e.x().expect("not the identity"));
    for part in [&b"A256GCM"[..], b"", b""] {
        h.update((part.len() as u32).to_be_bytes());
        h.update(part);
    }
    h.update(256u32.to_be_bytes());
    Zeroizing::new(h.finalize().into())
}

/// A random nonzero scalar, wiped when dropped (the ephemeral keys e and x: either, with the
/// record, gives the key away).
fn random_scalar() -> Zeroizing<Scalar> {
    loop {
        let s = Zeroizing::new(Scalar::random(&mut rand::rngs::OsRng));
        if !bool::from(s.is_zero()) {
            return s;
        }
    }
}

/// A clevis tang JWE (compact serialisation), parsed: what decrypting it needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TangJwe {
    compact: String,
    url: TangUrl,
    kid: String,
    epk: Jwk,
    server: Jwk,
    iv: [u8; 12],
    ciphertext: Vec<u8>,
    tag: [u8; 16],
}

impl TangJwe {
    /// Encrypts `key` to the server of `adv` (no request: the advertisement says all).
    pub fn encrypt(url: &TangUrl, adv: &Advertisement, key: &[u8]) -> TangJwe {
        let server = adv.exchange.point().expect("checked when parsed");
        let e = random_scalar();
        let epk = Jwk::of(&(ProjectivePoint::GENERATOR * *e).to_affine());
        let z = (ProjectivePoint::from(server) * *e).to_affine();
        let kid = adv.exchange.thumbprint();
        let header = json!({
            "alg": "ECDH-ES",
            "enc": "A256GCM",
            "clevis": {"pin": "tang", "tang": {"adv": adv.keys, "url": url.text}},
            "epk": epk.to_json_with(&[]),
            "kid": kid,
        });
        let protected = B64.encode(serde_json::to_vec(&header).expect("json"));
        let iv: [u8; 12] = rand::random();
        let cek = content_key(&z);
        // Invariant: a 32-byte key and a 12-byte nonce are what AES-256-GCM takes.
        let sealed = Aes256Gcm::new_from_slice(&*cek)
            .expect("32-byte key")
            .encrypt(Nonce::from_slice(&iv), Payload { msg: key, aad: protected.as_bytes() })
            .expect("AES-GCM encryption");
        let (ct, tag) = sealed.split_at(sealed.len() - 16);
        let compact = format!("{protected}..{}.{}.{}", B64.encode(iv), B64.encode(ct), B64.encode(tag));
        // Invariant: what was just written parses.
        TangJwe::parse(&compact).expect("a JWE made here parses")
    }

    /// Parses a compact clevis tang JWE: ECDH-ES with A256GCM, an epk, a kid naming a P-521
    /// exchange key of the advertisement it keeps, and the server's URL.
    pub fn parse(text: &str) -> Result<TangJwe, TangError> {
        let text = text.trim();
        if text.len() > MAX_REPLY {
            return Err(bad_jwe("longer than 64 KiB"));
        }
        let parts: Vec<&str> = text.split('.').collect();
        let [protected, enc_key, iv, ct, tag] = parts[..] else {
            return Err(bad_jwe("a compact JWE has five parts separated by dots (clevis encrypt writes one)"));
        };
        if !enc_key.is_empty() {
            return Err(bad_jwe("it has an encrypted key (ECDH-ES in direct mode has none)"));
        }
        let dec = |s: &str, what: &str| B64.decode(s).map_err(|e| bad_jwe(format!("its {what} is not base64url: {e}")));
        let header: Value = serde_json::from_slice(&dec(protected, "header")?)
            .map_err(|e| bad_jwe(format!("its header is not JSON: {e}")))?;
        let s = |v: &Value| v.as_str().map(str::to_string);
        let field = |path: &[&str]| path.iter().try_fold(&header, |v, k| v.get(k));
        if field(&["alg"]).and_then(Value::as_str) != Some("ECDH-ES")
            || field(&["enc"]).and_then(Value::as_str) != Some("A256GCM")
        {
            return Err(bad_jwe("it is not ECDH-ES with A256GCM"));
        }
        if field(&["clevis", "pin"]).and_then(Value::as_str) != Some("tang") {
            return Err(bad_jwe("its clevis pin is not tang"));
        }
        for unsupported in ["zip", "crit", "apu", "apv"] {
            if header.get(unsupported).is_some() {
                return Err(bad_jwe(format!("its header has {unsupported:?}, which clevis tang never sets")));
            }
        }
        let url = field(&["clevis", "tang", "url"]).and_then(s).ok_or_else(|| bad_jwe("no clevis.tang.url"))?;
        let url = TangUrl::parse(&url)?;
        let kid = field(&["kid"]).and_then(s).ok_or_else(|| bad_jwe("no kid"))?;
        if kid.is_empty() || !kid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return Err(bad_jwe("its kid is not a thumbprint"));
        }
        let epk: JwkJson = field(&["epk"])
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .ok_or_else(|| bad_jwe("no readable epk"))?;
        let epk = Jwk::parse(&epk).map_err(|e| bad_jwe(format!("its epk: {e}")))?;
        let adv = field(&["clevis", "tang", "adv"]).ok_or_else(|| bad_jwe("no clevis.tang.adv"))?;
        let keys = keys_of(adv).map_err(|e| bad_jwe(format!("its clevis.tang.adv: {e}")))?;
        let server = keys.into_iter().find(|k| k.thumbprint() == kid).ok_or_else(|| {
            bad_jwe("its kid names no P-521 key of its advertisement by SHA-256 thumbprint (made by an old clevis with SHA-1 thumbprints? encrypt again)")
        })?;
        let iv: [u8; 12] = dec(iv, "IV")?.try_into().map_err(|_| bad_jwe("its IV is not 12 bytes"))?;
        let tag: [u8; 16] = dec(tag, "tag")?.try_into().map_err(|_| bad_jwe("its tag is not 16 bytes"))?;
        let ciphertext = dec(ct, "ciphertext")?;
        Ok(TangJwe { compact: text.to_string(), url, kid, epk, server, iv, ciphertext, tag })
    }

    /// The JWE as clevis writes it.
    pub fn as_str(&self) -> &str {
        &self.compact
    }

    /// The server's URL.
    pub fn url(&self) -> &TangUrl {
        &self.url
    }

    /// The length of what it encrypts.
    pub fn plaintext_len(&self) -> usize {
        self.ciphertext.len()
    }

    /// Decrypts through the server: the McCallum–Relyea exchange, then AES-256-GCM.
    pub fn decrypt(&self) -> Result<Zeroizing<Vec<u8>>, TangError> {
        // Invariant: both were checked to be points of the curve when parsed.
        let epk = ProjectivePoint::from(self.epk.point().expect("checked"));
        let server = ProjectivePoint::from(self.server.point().expect("checked"));
        let x = random_scalar();
        let sent = (epk + ProjectivePoint::GENERATOR * *x).to_affine();
        if bool::from(sent.is_identity()) {
            return Err(self.url.bad_reply("the exchange drew the identity point; try again"));
        }
        let reply = self.url.recover(&self.kid, &sent)?;
        let z = (ProjectivePoint::from(reply) - server * *x).to_affine();
        if bool::from(z.is_identity()) {
            return Err(TangError::WrongKey { url: self.url.text.clone() });
        }
        let cek = content_key(&z);
        let mut sealed = self.ciphertext.clone();
        sealed.extend_from_slice(&self.tag);
        let protected = self.compact.split('.').next().unwrap_or_default();
        let plain = Aes256Gcm::new_from_slice(&*cek)
            .expect("32-byte key")
            .decrypt(Nonce::from_slice(&self.iv), Payload { msg: &sealed, aad: protected.as_bytes() })
            .map_err(|_| TangError::WrongKey { url: self.url.text.clone() })?;
        Ok(Zeroizing::new(plain))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_strictly() {
        let u = TangUrl::parse("http://tang.example:8080/t/").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.path.as_str()), ("tang.example", 8080, "/t"));
        let u = TangUrl::parse("http://[::1]:81").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.path.as_str()), ("::1", 81, ""));
        assert_eq!(TangUrl::parse("http://10.0.0.1").unwrap().port, 80);
        for bad in [
            "https://x",
            "http://",
            "http://a b",
            "http://u@h",
            "http://h:0",
            "http://h:99999",
            "http://h/?q",
            "ftp://h",
        ] {
            assert!(TangUrl::parse(bad).is_err(), "{bad}");
        }
    }

    /// RFC 7638's thumbprint of a P-521 key checked against `jose jwk thp -a S256` (clevis 19).
    #[test]
    fn thumbprint_matches_jose() {
        let j: JwkJson = serde_json::from_str(r#"{"kty":"EC","crv":"P-521","x":"AEBPBlJOBaTEpUJOe__AjJzQB132vdDdZHUXX5XYfJnjduV_MnERX01844ctlIX3B8OKbaXH-SJdRihI76gN73GB","y":"AOXoyoWVJsXLBws3ha74wByCM_IT4Z3rZ-E_9owuAOVxFjESAN7AwBTdlvwkQPda0q4VQvN4CqfJqFNZjtPdLVfd"}"#).unwrap();
        assert_eq!(Jwk::parse(&j).unwrap().thumbprint(), "cS8QisZGztK-skH3q1Py-_WR3EMvGHbrE9Mw90Y6X94");
    }

    #[test]
    fn replies_are_parsed_strictly() {
        let u = TangUrl::parse("http://h").unwrap();
        let ok = u.parse_reply(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}junk").unwrap();
        assert_eq!(ok.unwrap(), b"{}");
        assert_eq!(u.parse_reply(b"HTTP/1.1 404 Not Found\r\n\r\n").unwrap(), Err(404));
        assert!(u.parse_reply(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}").is_err());
        assert!(u.parse_reply(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}").is_err());
        assert!(u.parse_reply(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
        assert_eq!(complete(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"), Some(40));
    }
}
