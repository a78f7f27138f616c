//! guest-lib
