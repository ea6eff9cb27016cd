//! Ids as a container runtime makes them. UIDs as an API server makes them are in
//! [`crate::apiserver`].

use std::io::Read;

/// A container id as containerd makes it: 64 random hex digits.
pub fn container_id() -> String {
    let mut b = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .unwrap_or_else(|e| panic!("reading /dev/urandom: {e}"));
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_container_id_is_64_hex_digits() {
        let id = super::container_id();
        assert_eq!(id.len(), 64);
        assert!(id.bytes().all(|c| c.is_ascii_hexdigit()), "{id}");
    }
}
