//! The only module with `unsafe`.
#![allow(unsafe_code)]
