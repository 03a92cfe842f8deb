//! CTAPHID framing (CTAP 2.1 §11.2) over a stream of 64-byte reports: channel allocation (INIT),
//! PING, WINK, CANCEL, CBOR, and KEEPALIVE while a command waits for the user's touch.
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ctap::{ERR_KEEPALIVE_CANCEL, ERR_USER_ACTION_TIMEOUT};
use crate::{Presence, Shared};

pub const REPORT: usize = 64;
const BROADCAST: u32 = 0xffff_ffff;
const CMD_PING: u8 = 0x01;
const CMD_INIT: u8 = 0x06;
const CMD_WINK: u8 = 0x08;
const CMD_CBOR: u8 = 0x10;
const CMD_CANCEL: u8 = 0x11;
const CMD_KEEPALIVE: u8 = 0x3b;
const CMD_ERROR: u8 = 0x3f;
const ERR_INVALID_CMD: u8 = 0x01;
const ERR_INVALID_LEN: u8 = 0x03;
const ERR_INVALID_SEQ: u8 = 0x04;
const ERR_MSG_TIMEOUT: u8 = 0x05;
const ERR_INVALID_CHANNEL: u8 = 0x0b;
const STATUS_UPNEEDED: u8 = 2;
/// WINK | CBOR | NMSG (no CTAP1 MSG).
const CAPABILITIES: u8 = 0x01 | 0x04 | 0x08;
const MAX_MESSAGE: usize = 7609;
const POLL: Duration = Duration::from_millis(50);

struct Conn {
    stream: UnixStream,
    buf: Vec<u8>,
}

impl Conn {
    /// The next whole report, or `None` when `timeout` passes first.
    fn read_report(&mut self, timeout: Duration) -> io::Result<Option<[u8; REPORT]>> {
        let deadline = Instant::now() + timeout;
        while self.buf.len() < REPORT {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.stream.set_read_timeout(Some(left))?;
            let mut tmp = [0u8; REPORT];
            match self.stream.read(&mut tmp[..REPORT - self.buf.len()]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.buf.extend_from_slice(&tmp[..n]),
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let mut r = [0u8; REPORT];
        r.copy_from_slice(&self.buf[..REPORT]);
        self.buf.drain(..REPORT);
        Ok(Some(r))
    }

    fn send(&mut self, cid: u32, cmd: u8, data: &[u8]) -> io::Result<()> {
        let mut r = [0u8; REPORT];
        r[..4].copy_from_slice(&cid.to_be_bytes());
        r[4] = 0x80 | cmd;
        r[5..7].copy_from_slice(&(data.len() as u16).to_be_bytes());
        let first = data.len().min(REPORT - 7);
        r[7..7 + first].copy_from_slice(&data[..first]);
        self.stream.write_all(&r)?;
        for (seq, chunk) in data[first..].chunks(REPORT - 5).enumerate() {
            let mut r = [0u8; REPORT];
            r[..4].copy_from_slice(&cid.to_be_bytes());
            r[4] = seq as u8;
            r[5..5 + chunk.len()].copy_from_slice(chunk);
            self.stream.write_all(&r)?;
        }
        Ok(())
    }
}

/// Serves one open of the device until the client closes it or the authenticator is stopped.
pub(crate) fn serve(stream: UnixStream, shared: Arc<Shared>) {
    let mut c = Conn { stream, buf: Vec::new() };
    // A closed or broken connection simply ends the device's "open".
    let _ = serve_inner(&mut c, &shared);
}

fn serve_inner(c: &mut Conn, sh: &Shared) -> io::Result<()> {
    loop {
        if sh.stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        let Some(r) = c.read_report(POLL)? else { continue };
        let cid = u32::from_be_bytes([r[0], r[1], r[2], r[3]]);
        if r[4] & 0x80 == 0 {
            // A continuation with no message in progress: ignore it, as the spec allows.
            continue;
        }
        let cmd = r[4] & 0x7f;
        let len = usize::from(u16::from_be_bytes([r[5], r[6]]));
        if len > MAX_MESSAGE {
            c.send(cid, CMD_ERROR, &[ERR_INVALID_LEN])?;
            continue;
        }
        let mut data = r[7..7 + len.min(REPORT - 7)].to_vec();
        let mut seq = 0u8;
        let mut failed = None;
        while data.len() < len {
            let Some(cr) = c.read_report(Duration::from_millis(500))? else {
                failed = Some(ERR_MSG_TIMEOUT);
                break;
            };
            if cr[..4] != r[..4] || cr[4] != seq {
                failed = Some(ERR_INVALID_SEQ);
                break;
            }
            seq += 1;
            let take = (len - data.len()).min(REPORT - 5);
            data.extend_from_slice(&cr[5..5 + take]);
        }
        if let Some(e) = failed {
            c.send(cid, CMD_ERROR, &[e])?;
            continue;
        }
        match cmd {
            CMD_INIT => {
                if data.len() != 8 {
                    c.send(cid, CMD_ERROR, &[ERR_INVALID_LEN])?;
                    continue;
                }
                let new_cid = if cid == BROADCAST { sh.next_cid.fetch_add(1, Ordering::SeqCst) } else { cid };
                let mut resp = data.clone();
                resp.extend_from_slice(&new_cid.to_be_bytes());
                resp.extend_from_slice(&[2, 1, 0, 0, CAPABILITIES]);
                c.send(cid, CMD_INIT, &resp)?;
            }
            _ if cid == BROADCAST || cid == 0 => c.send(cid, CMD_ERROR, &[ERR_INVALID_CHANNEL])?,
            CMD_PING => c.send(cid, CMD_PING, &data)?,
            CMD_WINK => c.send(cid, CMD_WINK, &[])?,
            CMD_CANCEL => {}
            CMD_CBOR => {
                let reply = {
                    let mut auth = sh.auth.lock().unwrap_or_else(|e| e.into_inner());
                    let mut presence = || wait_presence(c, sh, cid);
                    auth.handle(&data, &mut presence)
                };
                c.send(cid, CMD_CBOR, &reply)?;
            }
            _ => c.send(cid, CMD_ERROR, &[ERR_INVALID_CMD])?,
        }
    }
}

/// Waits for the test's verdict on the touch, sending KEEPALIVE(UPNEEDED) meanwhile and giving up
/// on CANCEL, on the client going away, or after the authenticator's own timeout.
fn wait_presence(c: &mut Conn, sh: &Shared, cid: u32) -> Result<(), u8> {
    sh.presence_requests.fetch_add(1, Ordering::SeqCst);
    let start = Instant::now();
    loop {
        let granted = match *sh.presence.lock().unwrap_or_else(|e| e.into_inner()) {
            Presence::Grant => true,
            Presence::Withhold => false,
            Presence::Delay(d) => start.elapsed() >= d,
        };
        if granted {
            sh.touches.fetch_add(1, Ordering::SeqCst);
            return Ok(());
        }
        if start.elapsed() >= sh.up_timeout {
            return Err(ERR_USER_ACTION_TIMEOUT);
        }
        if c.send(cid, CMD_KEEPALIVE, &[STATUS_UPNEEDED]).is_err() {
            return Err(ERR_KEEPALIVE_CANCEL);
        }
        match c.read_report(POLL) {
            Ok(Some(r)) if r[..4] == cid.to_be_bytes() && r[4] == 0x80 | CMD_CANCEL => {
                return Err(ERR_KEEPALIVE_CANCEL)
            }
            Ok(_) => {}
            Err(_) => return Err(ERR_KEEPALIVE_CANCEL),
        }
        if sh.stop.load(Ordering::SeqCst) {
            return Err(ERR_KEEPALIVE_CANCEL);
        }
    }
}
