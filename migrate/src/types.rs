//! The small shared kinds at the bottom of the engine: which way a conversion goes
//! ([`Direction`]), how its data goes into staging ([`Method`], asked for as a [`Mode`]), and the
//! limit of copy rounds. They sit below the journal, the states and the errors that all name
//! them, so none of those has to import the others for them (issue 45).
//!
//! Each enum's words are written once, in `words!`: `Display` prints them and `FromStr` parses
//! them, so every front end accepts the same words with the same message for a wrong one. The
//! journal's names for `Direction` and `Method` are serde's (`snake_case`), the same words.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Most passes a copy may take in one run before verification gives up on a directory that keeps
/// changing. A journal recording a round at or beyond it does not parse.
pub(crate) const MAX_ROUNDS: u32 = 3;

/// Which way a conversion goes: into an encrypted staging directory (`convert`) or out of an
/// encrypted tree into a plain one (`decrypt`). Journals from before decrypt existed are
/// conversions; a conversion's journal does not name it, so it reads as it always did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// A plaintext tree becomes encrypted.
    #[default]
    Encrypt,
    /// An encrypted tree (the unlocked root of its policy) becomes plaintext.
    Decrypt,
}

impl Direction {
    pub(crate) fn is_encrypt(&self) -> bool {
        *self == Direction::Encrypt
    }

    /// The command that runs (and resumes) a conversion going this way.
    pub fn command(self) -> &'static str {
        match self {
            Direction::Encrypt => "convert",
            Direction::Decrypt => "decrypt",
        }
    }
}

/// How a conversion puts the data into staging.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// A full copy next to the original, verified, swapped; the original is removed afterwards.
    #[default]
    Copy,
    /// Each file moves into staging (large ones chunk by chunk from the end), so only a few
    /// chunks of extra space are needed; there is no backup window.
    Move,
}

/// How the caller wants the data to go into staging.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    Copy,
    Move,
    /// Copy when a second copy fits with the margin, else move.
    #[default]
    Auto,
}

/// When a conversion may take the directory away from its users.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Schedule {
    /// Nothing may use the directory: refused while a process does (unless forced); the
    /// conversion runs to the end.
    #[default]
    Now,
    /// The directory stays in use: the first copy, its verification and catch-up passes run
    /// meanwhile, and the conversion stops `CaughtUp`, before the swap. Copying only (a move
    /// empties the directory). Running the conversion again `Now` (when nothing uses the
    /// directory) makes a last catch-up pass, verifies what changed and swaps; again `Live`
    /// catches up once more.
    Live,
}

/// A word that names none of an enum's values; the message lists the accepted words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {given:?}; use {}", one_of(accepted))]
pub struct UnknownWord {
    /// What the word was to name ("mode", "method", "direction").
    pub what: &'static str,
    pub given: String,
    pub accepted: &'static [&'static str],
}

/// `"a"`, `"a" or "b"`, `"a", "b" or "c"`.
fn one_of(words: &[&str]) -> String {
    let quoted: Vec<String> = words.iter().map(|w| format!("{w:?}")).collect();
    match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => quoted.concat(),
    }
}

/// `Display`, `FromStr` and the list of accepted words of a unit enum, from one table.
macro_rules! words {
    ($($ty:ident($what:literal) { $($variant:ident = $word:literal),+ $(,)? })+) => {$(
        impl $ty {
            /// The words that name this enum's values, in order.
            pub const WORDS: &'static [&'static str] = &[$($word),+];

            /// The word for this value (what `Display` prints and `FromStr` parses).
            pub fn word(self) -> &'static str {
                match self {
                    $($ty::$variant => $word,)+
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.word())
            }
        }

        impl FromStr for $ty {
            type Err = UnknownWord;
            fn from_str(s: &str) -> Result<Self, UnknownWord> {
                match s {
                    $($word => Ok($ty::$variant),)+
                    _ => Err(UnknownWord { what: $what, given: s.to_owned(), accepted: Self::WORDS }),
                }
            }
        }
    )+};
}

words! {
    Direction("direction") { Encrypt = "encrypt", Decrypt = "decrypt" }
    Method("method") { Copy = "copy", Move = "move" }
    Mode("mode") { Copy = "copy", Move = "move", Auto = "auto" }
    Schedule("schedule") { Now = "now", Live = "live" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_round_trips_and_a_wrong_one_lists_the_accepted() {
        for m in [Mode::Copy, Mode::Move, Mode::Auto] {
            assert_eq!(m.to_string().parse::<Mode>(), Ok(m));
        }
        for m in [Method::Copy, Method::Move] {
            assert_eq!(m.to_string().parse::<Method>(), Ok(m));
        }
        for d in [Direction::Encrypt, Direction::Decrypt] {
            assert_eq!(d.to_string().parse::<Direction>(), Ok(d));
        }
        assert_eq!(Mode::WORDS, ["copy", "move", "auto"]);
        let e = "Copy".parse::<Mode>().unwrap_err();
        assert_eq!(e.to_string(), r#"unknown mode "Copy"; use "copy", "move" or "auto""#);
        let e = "".parse::<Method>().unwrap_err();
        assert_eq!(e.to_string(), r#"unknown method ""; use "copy" or "move""#);
        assert_eq!(one_of(&["x"]), r#""x""#);
    }

    /// The journal names a method and a direction by the same words (serde's), so what a status
    /// shows and what a front end parses are what the journal holds.
    #[test]
    fn the_journal_uses_the_same_words() {
        for m in [Method::Copy, Method::Move] {
            assert_eq!(serde_json::to_value(m).unwrap(), m.word());
        }
        for d in [Direction::Encrypt, Direction::Decrypt] {
            assert_eq!(serde_json::to_value(d).unwrap(), d.word());
        }
    }
}
