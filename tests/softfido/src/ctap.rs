//! The CTAP 2.1 command layer: getInfo, clientPIN, makeCredential, getAssertion (ES256, non-resident
//! credentials, hmac-secret). Requests and replies are raw CBOR; presence is asked of the caller.
use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use ciborium::Value;
use p256::ecdsa::{signature::Signer, Signature, SigningKey};
use p256::{PublicKey, SecretKey};
use sha2::{Digest, Sha256};

use crate::pinproto::{hmac_sha256, xy, Proto};
use crate::Options;

// CTAP status codes (CTAP 2.1 §8.2).
pub const OK: u8 = 0x00;
pub const ERR_INVALID_COMMAND: u8 = 0x01;
pub const ERR_INVALID_LENGTH: u8 = 0x03;
pub const ERR_INVALID_CBOR: u8 = 0x12;
pub const ERR_MISSING_PARAMETER: u8 = 0x14;
pub const ERR_CREDENTIAL_EXCLUDED: u8 = 0x19;
pub const ERR_UNSUPPORTED_ALGORITHM: u8 = 0x26;
pub const ERR_UNSUPPORTED_OPTION: u8 = 0x2B;
pub const ERR_INVALID_OPTION: u8 = 0x2C;
pub const ERR_KEEPALIVE_CANCEL: u8 = 0x2D;
pub const ERR_NO_CREDENTIALS: u8 = 0x2E;
pub const ERR_USER_ACTION_TIMEOUT: u8 = 0x2F;
pub const ERR_PIN_INVALID: u8 = 0x31;
pub const ERR_PIN_BLOCKED: u8 = 0x32;
pub const ERR_PIN_AUTH_INVALID: u8 = 0x33;
pub const ERR_PIN_AUTH_BLOCKED: u8 = 0x34;
pub const ERR_PIN_NOT_SET: u8 = 0x35;
pub const ERR_PUAT_REQUIRED: u8 = 0x36;
pub const ERR_PIN_POLICY_VIOLATION: u8 = 0x37;

const PIN_RETRIES_MAX: u8 = 8;
const PERM_MC: u64 = 0x01;
const PERM_GA: u64 = 0x02;
const CRED_ID_VERSION: u8 = 1;
const FLAG_UP: u8 = 0x01;
const FLAG_UV: u8 = 0x04;
const FLAG_AT: u8 = 0x40;
const FLAG_ED: u8 = 0x80;

type Reply = Result<Value, u8>;

struct PinToken {
    token: [u8; 32],
    proto: Proto,
    permissions: u64,
    rp_id: Option<String>,
}

/// Per-credential secrets, recovered from the credential id.
struct CredSecrets {
    key: SecretKey,
    cred_random_uv: [u8; 32],
    cred_random_no_uv: [u8; 32],
}

pub struct Authenticator {
    opts: Options,
    aaguid: [u8; 16],
    /// Wraps credential ids: a credential id is only usable on the authenticator that made it.
    wrap_key: [u8; 32],
    pin_hash: Option<[u8; 16]>,
    pub(crate) pin_retries: u8,
    consecutive_mismatches: u8,
    key_agreement: SecretKey,
    token: Option<PinToken>,
    sign_count: u32,
    /// One line per command handled ("clientPIN 9 p2", "getAssertion up=false"), for tests.
    pub(crate) log: Vec<String>,
}

impl Authenticator {
    pub fn new(opts: Options) -> Authenticator {
        Authenticator {
            aaguid: rand::random(),
            wrap_key: rand::random(),
            pin_hash: None,
            pin_retries: PIN_RETRIES_MAX,
            consecutive_mismatches: 0,
            key_agreement: SecretKey::random(&mut rand::rngs::OsRng),
            token: None,
            sign_count: 0,
            log: Vec::new(),
            opts,
        }
    }

    /// What unplugging and plugging back in resets: the key agreement key, the PIN token and
    /// the three-mismatches-per-power-up lock.
    pub fn power_cycle(&mut self) {
        self.key_agreement = SecretKey::random(&mut rand::rngs::OsRng);
        self.token = None;
        self.consecutive_mismatches = 0;
    }

    pub fn set_pin_direct(&mut self, pin: &str) {
        self.pin_hash = Some(pin_hash16(pin.as_bytes()));
        self.pin_retries = PIN_RETRIES_MAX;
    }

    /// One CTAP CBOR request (command byte + CBOR map) → status byte + CBOR reply.
    pub fn handle(&mut self, req: &[u8], presence: &mut dyn FnMut() -> Result<(), u8>) -> Vec<u8> {
        let Some((&cmd, body)) = req.split_first() else {
            return vec![ERR_INVALID_LENGTH];
        };
        let params = if body.is_empty() {
            Ok(Vec::new())
        } else {
            match ciborium::from_reader::<Value, _>(body) {
                Ok(Value::Map(m)) => Ok(m),
                _ => Err(ERR_INVALID_CBOR),
            }
        };
        let reply = params.and_then(|p| {
            let p = Params(p);
            self.log.push(describe(cmd, &p));
            match cmd {
                0x01 => self.make_credential(&p, presence),
                0x02 => self.get_assertion(&p, presence),
                0x04 => Ok(self.get_info()),
                0x06 => self.client_pin(&p, presence),
                _ => Err(ERR_INVALID_COMMAND),
            }
        });
        match reply {
            Ok(Value::Null) => vec![OK],
            Ok(v) => {
                let mut out = vec![OK];
                out.extend(cbor(v));
                out
            }
            Err(code) => vec![code],
        }
    }

    fn get_info(&self) -> Value {
        let mut options = vec![
            (text("rk"), Value::Bool(false)),
            (text("up"), Value::Bool(true)),
            (text("plat"), Value::Bool(false)),
            (text("clientPin"), Value::Bool(self.pin_hash.is_some())),
        ];
        if self.opts.builtin_uv {
            options.push((text("uv"), Value::Bool(true)));
        }
        if self.opts.token_permissions {
            options.push((text("pinUvAuthToken"), Value::Bool(true)));
        }
        let versions = if self.opts.token_permissions { vec!["FIDO_2_0", "FIDO_2_1"] } else { vec!["FIDO_2_0"] };
        map(vec![
            (1, Value::Array(versions.into_iter().map(text).collect())),
            (2, Value::Array(vec![text("hmac-secret")])),
            (3, Value::Bytes(self.aaguid.to_vec())),
            (4, Value::Map(options)),
            (5, int(1200)),
            (6, Value::Array(self.opts.pin_protocols.iter().map(|p| int(p.number().into())).collect())),
        ])
    }

    fn proto(&self, p: &Params, key: i64) -> Result<Proto, u8> {
        let n = p.uint(key)?.ok_or(ERR_MISSING_PARAMETER)?;
        let proto = Proto::from_u64(n).ok_or(ERR_INVALID_PARAMETER_PROTO)?;
        if !self.opts.pin_protocols.contains(&proto) {
            return Err(ERR_INVALID_PARAMETER_PROTO);
        }
        Ok(proto)
    }

    fn shared_secret(&self, proto: Proto, platform_key: &Value) -> Result<Vec<u8>, u8> {
        let pk = parse_cose_p256(platform_key).ok_or(ERR_INVALID_PARAMETER_PROTO)?;
        let z = p256::ecdh::diffie_hellman(self.key_agreement.to_nonzero_scalar(), pk.as_affine());
        Ok(proto.kdf(z.raw_secret_bytes()))
    }

    fn client_pin(&mut self, p: &Params, presence: &mut dyn FnMut() -> Result<(), u8>) -> Reply {
        let sub = p.uint(2)?.ok_or(ERR_MISSING_PARAMETER)?;
        match sub {
            0x01 => Ok(map(vec![(3, int(self.pin_retries.into()))])),
            0x02 => {
                self.proto(p, 1)?;
                let (x, y) = xy(&self.key_agreement.public_key());
                Ok(map(vec![(1, cose_key(x, y, -25))]))
            }
            0x03 => {
                let proto = self.proto(p, 1)?;
                if self.pin_hash.is_some() {
                    return Err(ERR_PIN_AUTH_INVALID);
                }
                let shared = self.shared_secret(proto, p.get(3).ok_or(ERR_MISSING_PARAMETER)?)?;
                let auth = p.bytes(4)?.ok_or(ERR_MISSING_PARAMETER)?;
                let new_enc = p.bytes(5)?.ok_or(ERR_MISSING_PARAMETER)?;
                if !proto.verify(&shared, new_enc, auth) {
                    return Err(ERR_PIN_AUTH_INVALID);
                }
                let pin = decode_new_pin(proto, &shared, new_enc)?;
                self.pin_hash = Some(pin_hash16(&pin));
                self.pin_retries = PIN_RETRIES_MAX;
                Ok(Value::Null)
            }
            0x04 => {
                let proto = self.proto(p, 1)?;
                let shared = self.shared_secret(proto, p.get(3).ok_or(ERR_MISSING_PARAMETER)?)?;
                let auth = p.bytes(4)?.ok_or(ERR_MISSING_PARAMETER)?;
                let new_enc = p.bytes(5)?.ok_or(ERR_MISSING_PARAMETER)?;
                let hash_enc = p.bytes(6)?.ok_or(ERR_MISSING_PARAMETER)?;
                self.pin_precheck()?;
                if !proto.verify(&shared, &[new_enc, hash_enc].concat(), auth) {
                    return Err(ERR_PIN_AUTH_INVALID);
                }
                self.check_pin_hash(proto, &shared, hash_enc)?;
                let pin = decode_new_pin(proto, &shared, new_enc)?;
                self.pin_hash = Some(pin_hash16(&pin));
                self.token = None;
                Ok(Value::Null)
            }
            0x05 | 0x09 => {
                let proto = self.proto(p, 1)?;
                let shared = self.shared_secret(proto, p.get(3).ok_or(ERR_MISSING_PARAMETER)?)?;
                let hash_enc = p.bytes(6)?.ok_or(ERR_MISSING_PARAMETER)?;
                let (permissions, rp_id) = if sub == 0x09 {
                    if !self.opts.token_permissions {
                        return Err(ERR_INVALID_COMMAND_SUB);
                    }
                    let perms = p.uint(9)?.ok_or(ERR_MISSING_PARAMETER)?;
                    if perms == 0 {
                        return Err(ERR_INVALID_PARAMETER_PROTO);
                    }
                    (perms, p.text(10)?.map(str::to_owned))
                } else {
                    (PERM_MC | PERM_GA, None)
                };
                self.pin_precheck()?;
                self.check_pin_hash(proto, &shared, hash_enc)?;
                let token: [u8; 32] = rand::random();
                self.token = Some(PinToken { token, proto, permissions, rp_id });
                Ok(map(vec![(2, Value::Bytes(proto.encrypt(&shared, &token)))]))
            }
            // getPinUvAuthTokenUsingUvWithPermissions: the built-in verification (here: the touch
            // of the finger on the sensor) instead of a PIN.
            0x06 if self.opts.builtin_uv => {
                let proto = self.proto(p, 1)?;
                let shared = self.shared_secret(proto, p.get(3).ok_or(ERR_MISSING_PARAMETER)?)?;
                let permissions = p.uint(9)?.ok_or(ERR_MISSING_PARAMETER)?;
                if permissions == 0 {
                    return Err(ERR_INVALID_PARAMETER_PROTO);
                }
                let rp_id = p.text(10)?.map(str::to_owned);
                presence()?;
                let token: [u8; 32] = rand::random();
                self.token = Some(PinToken { token, proto, permissions, rp_id });
                Ok(map(vec![(2, Value::Bytes(proto.encrypt(&shared, &token)))]))
            }
            0x07 if self.opts.builtin_uv => Ok(map(vec![(5, int(8))])),
            _ => Err(ERR_INVALID_COMMAND_SUB),
        }
    }

    fn pin_precheck(&self) -> Result<(), u8> {
        if self.pin_hash.is_none() {
            return Err(ERR_PIN_NOT_SET);
        }
        if self.pin_retries == 0 {
            return Err(ERR_PIN_BLOCKED);
        }
        if self.consecutive_mismatches >= 3 {
            return Err(ERR_PIN_AUTH_BLOCKED);
        }
        Ok(())
    }

    /// Decrements the retries before comparing, as the spec requires, so that cutting power
    /// mid-check cannot give free guesses.
    fn check_pin_hash(&mut self, proto: Proto, shared: &[u8], hash_enc: &[u8]) -> Result<(), u8> {
        self.pin_retries -= 1;
        let given = proto.decrypt(shared, hash_enc).ok_or(ERR_PIN_AUTH_INVALID)?;
        let want = self.pin_hash.ok_or(ERR_PIN_NOT_SET)?;
        if given.len() != 16 || given.iter().zip(want).fold(0u8, |a, (x, y)| a | (x ^ y)) != 0 {
            self.key_agreement = SecretKey::random(&mut rand::rngs::OsRng);
            self.consecutive_mismatches += 1;
            if self.pin_retries == 0 {
                return Err(ERR_PIN_BLOCKED);
            }
            if self.consecutive_mismatches >= 3 {
                return Err(ERR_PIN_AUTH_BLOCKED);
            }
            return Err(ERR_PIN_INVALID);
        }
        self.pin_retries = PIN_RETRIES_MAX;
        self.consecutive_mismatches = 0;
        Ok(())
    }

    /// Checks a pinUvAuthParam over `cdh` against the current token; `Ok(true)` = user verified.
    fn check_uv_param(&self, p: &Params, auth_key: i64, proto_key: i64, perm: u64, rp_id: &str) -> Result<bool, u8> {
        let Some(auth) = p.bytes(auth_key)? else { return Ok(false) };
        let proto = self.proto(p, proto_key)?;
        let cdh = p.bytes(if perm == PERM_MC { 1 } else { 2 })?.ok_or(ERR_MISSING_PARAMETER)?;
        let tok = self.token.as_ref().ok_or(ERR_PIN_AUTH_INVALID)?;
        if tok.proto != proto || !proto.verify(&tok.token, cdh, auth) {
            return Err(ERR_PIN_AUTH_INVALID);
        }
        if tok.permissions & perm == 0 || tok.rp_id.as_deref().is_some_and(|r| r != rp_id) {
            return Err(ERR_PIN_AUTH_INVALID);
        }
        Ok(true)
    }

    /// An empty pinUvAuthParam is the "select me by touch" probe (CTAP 2.1 §6.1.2 step 1).
    fn empty_auth_probe(&self, presence: &mut dyn FnMut() -> Result<(), u8>) -> Reply {
        presence()?;
        Err(if self.pin_hash.is_some() { ERR_PIN_INVALID } else { ERR_PIN_NOT_SET })
    }

    fn make_credential(&mut self, p: &Params, presence: &mut dyn FnMut() -> Result<(), u8>) -> Reply {
        let cdh = p.bytes(1)?.ok_or(ERR_MISSING_PARAMETER)?;
        let rp = p.get(2).ok_or(ERR_MISSING_PARAMETER)?;
        let rp_id = map_text(rp, "id").ok_or(ERR_MISSING_PARAMETER)?.to_owned();
        p.get(3).ok_or(ERR_MISSING_PARAMETER)?;
        let algs = p.get(4).ok_or(ERR_MISSING_PARAMETER)?;
        let es256 = match algs {
            Value::Array(a) => a.iter().any(|e| map_int(e, "alg") == Some(-7)),
            _ => return Err(ERR_INVALID_CBOR),
        };
        if !es256 {
            return Err(ERR_UNSUPPORTED_ALGORITHM);
        }
        if p.bytes(8)?.is_some_and(|a| a.is_empty()) {
            return self.empty_auth_probe(presence);
        }
        let (rk, uv_opt, up_opt) = options(p.get(7))?;
        if rk == Some(true) || up_opt == Some(false) {
            return Err(ERR_UNSUPPORTED_OPTION);
        }
        let mut uv = self.check_uv_param(p, 8, 9, PERM_MC, &rp_id)?;
        if !uv && uv_opt == Some(true) {
            if !self.opts.builtin_uv {
                return Err(ERR_INVALID_OPTION);
            }
            uv = true;
        }
        if !uv && self.pin_hash.is_some() {
            return Err(ERR_PUAT_REQUIRED);
        }
        let rp_hash: [u8; 32] = Sha256::digest(rp_id.as_bytes()).into();
        if let Some(Value::Array(ex)) = p.get(5) {
            if ex.iter().filter_map(|d| map_bytes(d, "id")).any(|id| self.unwrap_cred(id, &rp_hash).is_some()) {
                presence()?;
                return Err(ERR_CREDENTIAL_EXCLUDED);
            }
        }
        let want_hmac = matches!(p.get(6), Some(Value::Map(m)) if m.iter().any(|(k, v)| *k == text("hmac-secret") && *v == Value::Bool(true)));
        presence()?;
        let key = SecretKey::random(&mut rand::rngs::OsRng);
        let secrets = CredSecrets { key, cred_random_uv: rand::random(), cred_random_no_uv: rand::random() };
        let cred_id = self.wrap_cred(&secrets, &rp_hash);
        self.sign_count += 1;
        let mut flags = FLAG_UP | FLAG_AT;
        if uv {
            flags |= FLAG_UV;
        }
        if want_hmac {
            flags |= FLAG_ED;
        }
        let mut auth_data = auth_data_head(&rp_hash, flags, self.sign_count);
        auth_data.extend_from_slice(&self.aaguid);
        auth_data.extend_from_slice(&(cred_id.len() as u16).to_be_bytes());
        auth_data.extend_from_slice(&cred_id);
        let (x, y) = xy(&secrets.key.public_key());
        auth_data.extend(cbor(cose_key(x, y, -7)));
        if want_hmac {
            let ext = Value::Map(vec![(text("hmac-secret"), Value::Bool(true))]);
            auth_data.extend(cbor(ext));
        }
        // Packed self-attestation: signed by the credential key itself.
        let sig: Signature = SigningKey::from(&secrets.key).sign(&[&auth_data[..], cdh].concat());
        Ok(map(vec![
            (1, text("packed")),
            (2, Value::Bytes(auth_data)),
            (
                3,
                Value::Map(vec![(text("alg"), int(-7)), (text("sig"), Value::Bytes(sig.to_der().as_bytes().to_vec()))]),
            ),
        ]))
    }

    fn get_assertion(&mut self, p: &Params, presence: &mut dyn FnMut() -> Result<(), u8>) -> Reply {
        let rp_id = p.text(1)?.ok_or(ERR_MISSING_PARAMETER)?.to_owned();
        let cdh = p.bytes(2)?.ok_or(ERR_MISSING_PARAMETER)?.to_vec();
        if p.bytes(6)?.is_some_and(|a| a.is_empty()) {
            return self.empty_auth_probe(presence);
        }
        let (rk, uv_opt, up_opt) = options(p.get(5))?;
        if rk.is_some() {
            return Err(ERR_INVALID_OPTION);
        }
        let up = up_opt.unwrap_or(true);
        let mut uv = self.check_uv_param(p, 6, 7, PERM_GA, &rp_id)?;
        if !uv && uv_opt == Some(true) {
            if !self.opts.builtin_uv {
                return Err(ERR_INVALID_OPTION);
            }
            uv = true;
        }
        let rp_hash: [u8; 32] = Sha256::digest(rp_id.as_bytes()).into();
        let found = match p.get(3) {
            Some(Value::Array(list)) => list
                .iter()
                .filter_map(|d| map_bytes(d, "id"))
                .find_map(|id| self.unwrap_cred(id, &rp_hash).map(|s| (id.to_vec(), s))),
            _ => None,
        };
        let Some((cred_id, secrets)) = found else { return Err(ERR_NO_CREDENTIALS) };

        let hmac_req = match p.get(4) {
            Some(Value::Map(m)) => m.iter().find(|(k, _)| *k == text("hmac-secret")).map(|(_, v)| v),
            _ => None,
        };
        let hmac_out = match hmac_req {
            None => None,
            // The secret is only ever released with the user present.
            Some(_) if !up => return Err(ERR_UNSUPPORTED_OPTION),
            Some(Value::Map(h)) => {
                let h = Params(h.clone());
                let proto = match h.uint(4)? {
                    None => Proto::One,
                    Some(n) => Proto::from_u64(n).ok_or(ERR_INVALID_PARAMETER_PROTO)?,
                };
                let shared = self.shared_secret(proto, h.get(1).ok_or(ERR_MISSING_PARAMETER)?)?;
                let salt_enc = h.bytes(2)?.ok_or(ERR_MISSING_PARAMETER)?;
                let salt_auth = h.bytes(3)?.ok_or(ERR_MISSING_PARAMETER)?;
                if !proto.verify(&shared, salt_enc, salt_auth) {
                    return Err(ERR_PIN_AUTH_INVALID);
                }
                let salts = proto.decrypt(&shared, salt_enc).ok_or(ERR_INVALID_LENGTH)?;
                if salts.len() != 32 && salts.len() != 64 {
                    return Err(ERR_INVALID_LENGTH);
                }
                let cr = if uv { &secrets.cred_random_uv } else { &secrets.cred_random_no_uv };
                let out: Vec<u8> = salts.chunks(32).flat_map(|s| hmac_sha256(cr, s)).collect();
                Some(proto.encrypt(&shared, &out))
            }
            Some(_) => return Err(ERR_INVALID_CBOR),
        };
        if up {
            presence()?;
        }
        self.sign_count += 1;
        let mut flags = 0;
        if up {
            flags |= FLAG_UP;
        }
        if uv {
            flags |= FLAG_UV;
        }
        if hmac_out.is_some() {
            flags |= FLAG_ED;
        }
        let mut auth_data = auth_data_head(&rp_hash, flags, self.sign_count);
        if let Some(out) = hmac_out {
            let ext = Value::Map(vec![(text("hmac-secret"), Value::Bytes(out))]);
            auth_data.extend(cbor(ext));
        }
        let sig: Signature = SigningKey::from(&secrets.key).sign(&[&auth_data[..], &cdh].concat());
        Ok(map(vec![
            (1, Value::Map(vec![(text("id"), Value::Bytes(cred_id)), (text("type"), text("public-key"))])),
            (2, Value::Bytes(auth_data)),
            (3, Value::Bytes(sig.to_der().as_bytes().to_vec())),
        ]))
    }

    /// Credential id = version || nonce || AES-256-GCM(wrap key, private key || credRandom×2),
    /// bound to the relying party by the associated data.
    fn wrap_cred(&self, s: &CredSecrets, rp_hash: &[u8; 32]) -> Vec<u8> {
        let nonce: [u8; 12] = rand::random();
        let mut pt = s.key.to_bytes().to_vec();
        pt.extend_from_slice(&s.cred_random_uv);
        pt.extend_from_slice(&s.cred_random_no_uv);
        let ct = Aes256Gcm::new((&self.wrap_key).into())
            .encrypt(Nonce::from_slice(&nonce), Payload { msg: &pt, aad: rp_hash })
            .expect("short AES-GCM message");
        [&[CRED_ID_VERSION][..], &nonce, &ct].concat()
    }

    fn unwrap_cred(&self, id: &[u8], rp_hash: &[u8; 32]) -> Option<CredSecrets> {
        if id.len() != 1 + 12 + 96 + 16 || id[0] != CRED_ID_VERSION {
            return None;
        }
        let pt = Aes256Gcm::new((&self.wrap_key).into())
            .decrypt(Nonce::from_slice(&id[1..13]), Payload { msg: &id[13..], aad: rp_hash })
            .ok()?;
        Some(CredSecrets {
            key: SecretKey::from_slice(&pt[..32]).ok()?,
            cred_random_uv: pt[32..64].try_into().ok()?,
            cred_random_no_uv: pt[64..96].try_into().ok()?,
        })
    }
}

const ERR_INVALID_PARAMETER_PROTO: u8 = 0x02; // CTAP1_ERR_INVALID_PARAMETER
const ERR_INVALID_COMMAND_SUB: u8 = 0x3E; // CTAP2_ERR_INVALID_SUBCOMMAND

/// "clientPIN 9 p2", "getAssertion up=false hmac-secret p1": what a test may want to check was used.
fn describe(cmd: u8, p: &Params) -> String {
    let proto = |k| p.uint(k).ok().flatten().map(|n| format!(" p{n}")).unwrap_or_default();
    match cmd {
        0x06 => format!("clientPIN {}{}", p.uint(2).ok().flatten().unwrap_or(0), proto(1)),
        0x01 => format!("makeCredential{}", proto(9)),
        0x02 => {
            let up = options(p.get(5)).ok().and_then(|o| o.2).unwrap_or(true);
            let hs = match p.get(4) {
                Some(Value::Map(m)) => m.iter().find(|(k, _)| *k == text("hmac-secret")).map(|(_, v)| match v {
                    Value::Map(h) => format!(" hmac-secret p{}", Params(h.clone()).uint(4).ok().flatten().unwrap_or(1)),
                    _ => " hmac-secret".into(),
                }),
                _ => None,
            };
            format!("getAssertion up={up}{}{}", hs.unwrap_or_default(), proto(7))
        }
        0x04 => "getInfo".into(),
        c => format!("command {c:#04x}"),
    }
}

fn pin_hash16(pin: &[u8]) -> [u8; 16] {
    let h = Sha256::digest(pin);
    let mut out = [0u8; 16];
    out.copy_from_slice(&h[..16]);
    out
}

/// newPinEnc is the PIN, zero-padded to 64 bytes; 4..=63 bytes of PIN.
fn decode_new_pin(proto: Proto, shared: &[u8], enc: &[u8]) -> Result<Vec<u8>, u8> {
    let padded = proto.decrypt(shared, enc).ok_or(ERR_PIN_POLICY_VIOLATION)?;
    if padded.len() != 64 {
        return Err(ERR_PIN_POLICY_VIOLATION);
    }
    let pin: Vec<u8> = padded.iter().copied().take_while(|&b| b != 0).collect();
    if pin.len() < 4 || pin.len() > 63 {
        return Err(ERR_PIN_POLICY_VIOLATION);
    }
    Ok(pin)
}

/// CTAP2 canonical CBOR (RFC 7049 §3.9): every map sorted by its keys' encodings, shorter
/// first, then bytewise. libfido2 refuses replies that are not.
fn cbor(v: Value) -> Vec<u8> {
    fn canonical(v: Value) -> Value {
        match v {
            Value::Map(m) => {
                let mut m: Vec<(Vec<u8>, Value, Value)> =
                    m.into_iter().map(|(k, v)| (raw(&k), canonical(k), canonical(v))).collect();
                m.sort_by(|a, b| (a.0.len(), &a.0).cmp(&(b.0.len(), &b.0)));
                Value::Map(m.into_iter().map(|(_, k, v)| (k, v)).collect())
            }
            Value::Array(a) => Value::Array(a.into_iter().map(canonical).collect()),
            v => v,
        }
    }
    fn raw(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        // Invariant: serializing an in-memory Value into a Vec cannot fail.
        ciborium::into_writer(v, &mut out).expect("CBOR into Vec");
        out
    }
    raw(&canonical(v))
}

fn auth_data_head(rp_hash: &[u8; 32], flags: u8, count: u32) -> Vec<u8> {
    let mut a = rp_hash.to_vec();
    a.push(flags);
    a.extend_from_slice(&count.to_be_bytes());
    a
}

fn cose_key(x: Vec<u8>, y: Vec<u8>, alg: i64) -> Value {
    Value::Map(vec![
        (int(1), int(2)),
        (int(3), int(alg)),
        (int(-1), int(1)),
        (int(-2), Value::Bytes(x)),
        (int(-3), Value::Bytes(y)),
    ])
}

fn parse_cose_p256(v: &Value) -> Option<PublicKey> {
    let Value::Map(m) = v else { return None };
    let get = |k: i64| m.iter().find(|(kk, _)| *kk == int(k)).map(|(_, v)| v);
    let (Some(Value::Bytes(x)), Some(Value::Bytes(y))) = (get(-2), get(-3)) else { return None };
    if x.len() != 32 || y.len() != 32 || get(-1) != Some(&int(1)) {
        return None;
    }
    PublicKey::from_sec1_bytes(&[&[4u8][..], x, y].concat()).ok()
}

/// The `rk`, `uv` and `up` options, each absent, true or false.
type Opts = (Option<bool>, Option<bool>, Option<bool>);

fn options(v: Option<&Value>) -> Result<Opts, u8> {
    let mut o = (None, None, None);
    if let Some(v) = v {
        let Value::Map(m) = v else { return Err(ERR_INVALID_CBOR) };
        for (k, v) in m {
            let (Value::Text(k), Value::Bool(b)) = (k, v) else { return Err(ERR_INVALID_CBOR) };
            match k.as_str() {
                "rk" => o.0 = Some(*b),
                "uv" => o.1 = Some(*b),
                "up" => o.2 = Some(*b),
                _ => {}
            }
        }
    }
    Ok(o)
}

fn text(s: &str) -> Value {
    Value::Text(s.to_owned())
}
fn int(i: i64) -> Value {
    Value::Integer(i.into())
}
fn map(entries: Vec<(i64, Value)>) -> Value {
    Value::Map(entries.into_iter().map(|(k, v)| (int(k), v)).collect())
}
fn map_text<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    match v {
        Value::Map(m) => m.iter().find(|(k, _)| *k == text(key)).and_then(|(_, v)| v.as_text()),
        _ => None,
    }
}
fn map_bytes<'a>(v: &'a Value, key: &str) -> Option<&'a [u8]> {
    match v {
        Value::Map(m) => m.iter().find(|(k, _)| *k == text(key)).and_then(|(_, v)| v.as_bytes().map(|b| &b[..])),
        _ => None,
    }
}
fn map_int(v: &Value, key: &str) -> Option<i64> {
    match v {
        Value::Map(m) => m
            .iter()
            .find(|(k, _)| *k == text(key))
            .and_then(|(_, v)| v.as_integer())
            .and_then(|i| i64::try_from(i).ok()),
        _ => None,
    }
}

/// A request's integer-keyed parameter map.
struct Params(Vec<(Value, Value)>);

impl Params {
    fn get(&self, key: i64) -> Option<&Value> {
        self.0.iter().find(|(k, _)| *k == int(key)).map(|(_, v)| v)
    }
    fn bytes(&self, key: i64) -> Result<Option<&[u8]>, u8> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bytes(b)) => Ok(Some(b)),
            Some(_) => Err(ERR_INVALID_CBOR),
        }
    }
    fn text(&self, key: i64) -> Result<Option<&str>, u8> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Text(t)) => Ok(Some(t)),
            Some(_) => Err(ERR_INVALID_CBOR),
        }
    }
    fn uint(&self, key: i64) -> Result<Option<u64>, u8> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Integer(i)) => u64::try_from(*i).map(Some).map_err(|_| ERR_INVALID_CBOR),
            Some(_) => Err(ERR_INVALID_CBOR),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_canonical_cbor() {
        let v = Value::Map(vec![
            (text("clientPin"), Value::Bool(true)),
            (text("uv"), Value::Bool(true)),
            (int(-1), int(1)),
            (int(3), Value::Map(vec![(text("up"), Value::Bool(true)), (text("rk"), Value::Bool(false))])),
        ]);
        let back: Value = ciborium::from_reader(&cbor(v)[..]).unwrap();
        let Value::Map(m) = back else { panic!("not a map") };
        let keys: Vec<Value> = m.iter().map(|(k, _)| k.clone()).collect();
        assert_eq!(keys, vec![int(3), int(-1), text("uv"), text("clientPin")]);
        assert_eq!(m[0].1, Value::Map(vec![(text("rk"), Value::Bool(false)), (text("up"), Value::Bool(true))]));
    }
}
