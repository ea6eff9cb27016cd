//! The pure domain: CPU sets, topology, pools, state, allocation and effect planning.
//!
//! Nothing here does I/O, reads a clock or awaits. The engine feeds it requests and executes the
//! effects it returns through the host side.
#![forbid(unsafe_code)]
pub mod alloc;
pub mod boot;
pub mod cache;
pub mod classes;
pub mod container;
pub mod cpuset;
pub mod devices;
pub mod dra;
pub mod edit;
pub mod housekeeping;
pub mod isolation;
pub mod noise;
pub mod plan;
pub mod pool;
pub mod power;
pub mod state;
pub mod topology;

/// Characters of a caller's input an error repeats; the rest is counted, not repeated.
pub const ECHO_CHARS: usize = 64;

/// `input` as an error may repeat it: whole up to [`ECHO_CHARS`] characters, else its first
/// [`ECHO_CHARS`] and its length (`aaaa… (100000 bytes)`). Every interface's errors echo input
/// through this, so a 100 KB pool name or a 1 MB device id costs a short message.
pub fn echo(input: &str) -> String {
    match input.char_indices().nth(ECHO_CHARS) {
        None => input.to_owned(),
        Some((cut, _)) => format!("{}… ({} bytes)", &input[..cut], input.len()),
    }
}

#[cfg(test)]
mod echo_tests {
    #[test]
    fn long_input_is_cut_and_counted() {
        assert_eq!(super::echo("web"), "web");
        let exact = "é".repeat(super::ECHO_CHARS);
        assert_eq!(super::echo(&exact), exact);
        let long = "a".repeat(100_000);
        assert_eq!(super::echo(&long), format!("{}… (100000 bytes)", "a".repeat(64)));
        assert_eq!(super::echo(&"é".repeat(65)), format!("{}… (130 bytes)", "é".repeat(64)));
    }
}
