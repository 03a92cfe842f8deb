//! The software authenticator as a USB security key: a HID device made through /dev/uhid, so
//! libfido2 finds it on /dev/hidraw like a real key (scripts/system-test.sh runs it in its guest).
//!
//!     softfido-uhid SOCKET      (root; commands on stdin, one a line)
//!
//! The authenticator itself listens on SOCKET (as in the tests); every open of the hidraw node is
//! one connection to it. Touches are granted. Commands: `unplug` destroys the HID device (what
//! pulling the key out does), `plug` creates it again — the same authenticator, so credentials
//! made before still work; `quit` (or end of input) unplugs and exits.
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use dirseal_softfido::{Options, SoftFido};

const REPORT: usize = 64;
// <linux/uhid.h>: event types and the size of struct uhid_event (packed: u32 type + the largest
// request, uhid_create2_req).
const UHID_DESTROY: u32 = 1;
const UHID_OPEN: u32 = 4;
const UHID_CLOSE: u32 = 5;
const UHID_OUTPUT: u32 = 6;
const UHID_CREATE2: u32 = 11;
const UHID_INPUT2: u32 = 12;
const EVENT_SIZE: usize = 4 + 128 + 64 + 64 + 2 + 2 + 4 * 4 + 4096;
const BUS_USB: u16 = 3;

/// FIDO usage page 0xF1D0, usage CTAPHID: 64-byte input and output reports, no report ids.
const DESCRIPTOR: &[u8] = &[
    0x06, 0xd0, 0xf1, 0x09, 0x01, 0xa1, 0x01, // usage page FIDO, usage CTAPHID, application
    0x09, 0x20, 0x15, 0x00, 0x26, 0xff, 0x00, 0x75, 0x08, 0x95, 0x40, 0x81, 0x02, // data in
    0x09, 0x21, 0x15, 0x00, 0x26, 0xff, 0x00, 0x75, 0x08, 0x95, 0x40, 0x91, 0x02, // data out
    0xc0,
];

fn create_event() -> Vec<u8> {
    let mut ev = vec![0u8; EVENT_SIZE];
    ev[..4].copy_from_slice(&UHID_CREATE2.to_ne_bytes());
    let name = b"dirseal softfido";
    ev[4..4 + name.len()].copy_from_slice(name);
    let mut o = 4 + 128 + 64 + 64;
    ev[o..o + 2].copy_from_slice(&(DESCRIPTOR.len() as u16).to_ne_bytes());
    ev[o + 2..o + 4].copy_from_slice(&BUS_USB.to_ne_bytes());
    o += 4;
    for v in [0x1209u32, 0xd1d5, 1, 0] {
        // vendor (pid.codes), product, version, country
        ev[o..o + 4].copy_from_slice(&v.to_ne_bytes());
        o += 4;
    }
    ev[o..o + DESCRIPTOR.len()].copy_from_slice(DESCRIPTOR);
    ev
}

fn input_event(report: &[u8; REPORT]) -> Vec<u8> {
    let mut ev = vec![0u8; EVENT_SIZE];
    ev[..4].copy_from_slice(&UHID_INPUT2.to_ne_bytes());
    ev[4..6].copy_from_slice(&(REPORT as u16).to_ne_bytes());
    ev[6..6 + REPORT].copy_from_slice(report);
    ev
}

/// One plugged-in device: its /dev/uhid handle and the connection of the current open.
struct Device {
    uhid: File,
    conn: Arc<Mutex<Option<UnixStream>>>,
}

impl Device {
    fn plug(socket: &Path) -> io::Result<Device> {
        let mut uhid = OpenOptions::new().read(true).write(true).open("/dev/uhid")?;
        uhid.write_all(&create_event())?;
        let conn: Arc<Mutex<Option<UnixStream>>> = Arc::new(Mutex::new(None));
        let (mut events, writer, c, socket) =
            (uhid.try_clone()?, uhid.try_clone()?, conn.clone(), socket.to_path_buf());
        // Events from the kernel: opens, closes and output reports. Ends when the device is
        // destroyed (the read fails or returns nothing).
        std::thread::spawn(move || {
            let mut ev = vec![0u8; EVENT_SIZE];
            loop {
                let n = match events.read(&mut ev) {
                    Ok(n) if n >= 4 => n,
                    _ => return,
                };
                let kind = u32::from_ne_bytes([ev[0], ev[1], ev[2], ev[3]]);
                match kind {
                    UHID_OPEN => {
                        let Ok(s) = UnixStream::connect(&socket) else { continue };
                        let Ok(mut reader) = s.try_clone() else { continue };
                        *c.lock().unwrap_or_else(|e| e.into_inner()) = Some(s);
                        let Ok(mut w) = writer.try_clone() else { continue };
                        // Replies of the authenticator become input reports until it closes.
                        std::thread::spawn(move || {
                            let mut r = [0u8; REPORT];
                            while reader.read_exact(&mut r).is_ok() {
                                if w.write_all(&input_event(&r)).is_err() {
                                    return;
                                }
                            }
                        });
                    }
                    UHID_CLOSE => {
                        if let Some(s) = c.lock().unwrap_or_else(|e| e.into_inner()).take() {
                            let _ = s.shutdown(std::net::Shutdown::Both);
                        }
                    }
                    UHID_OUTPUT if n >= 4 + 4096 + 2 => {
                        let size = u16::from_ne_bytes([ev[4 + 4096], ev[4 + 4097]]) as usize;
                        // hidraw passes the report number first (0: the descriptor has none).
                        let data = &ev[4..4 + size.min(4096)];
                        let data = if data.len() == REPORT + 1 { &data[1..] } else { data };
                        if data.len() == REPORT {
                            if let Some(s) = c.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                                let _ = s.write_all(data);
                            }
                        }
                    }
                    _ => {}
                }
            }
        });
        Ok(Device { uhid, conn })
    }

    fn unplug(mut self) {
        let mut ev = vec![0u8; EVENT_SIZE];
        ev[..4].copy_from_slice(&UHID_DESTROY.to_ne_bytes());
        let _ = self.uhid.write_all(&ev);
        if let Some(s) = self.conn.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

fn main() {
    let Some(socket) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: softfido-uhid SOCKET (commands on stdin: plug, unplug, quit)");
        std::process::exit(2);
    };
    let _ = std::fs::remove_file(&socket);
    let _fido = match SoftFido::start(&socket, Options::default()) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("softfido-uhid: cannot listen on {}: {e}", socket.display());
            std::process::exit(1);
        }
    };
    let mut dev = match Device::plug(&socket) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("softfido-uhid: cannot create the HID device through /dev/uhid: {e}");
            std::process::exit(1);
        }
    };
    println!("plugged");
    for line in io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        match line.trim() {
            "unplug" => {
                if let Some(d) = dev.take() {
                    d.unplug();
                }
                println!("unplugged");
            }
            "plug" => {
                if dev.is_none() {
                    match Device::plug(&socket) {
                        Ok(d) => dev = Some(d),
                        Err(e) => eprintln!("softfido-uhid: cannot create the HID device: {e}"),
                    }
                }
                println!("plugged");
            }
            "quit" => break,
            "" => {}
            other => eprintln!("softfido-uhid: unknown command {other:?} (plug, unplug, quit)"),
        }
    }
    if let Some(d) = dev.take() {
        d.unplug();
    }
}
