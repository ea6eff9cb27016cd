//! How a DRA claim's assignments are named: `dra-<uid>-<n>`, one per device of the claim. The
//! one place the rule is written: the DRA driver names the assignments it books with
//! [`assignment_name`], a claim record may name only its own claim's ([`claim_of`]), and the
//! NRI plugin tells a claim's assignment from any other by it.

/// The longest claim uid taken: Kubernetes' are UUIDs (36), and `dra-<uid>-<n>` must stay a
/// device id (63).
pub const MAX_UID: usize = 56;

/// Whether `uid` may name a record (and an assignment): 1 to [`MAX_UID`] of `A-Za-z0-9-`.
pub fn valid_uid(uid: &str) -> bool {
    !uid.is_empty() && uid.len() <= MAX_UID && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// The name of claim `uid`'s assignment for its `n`th device (from 0; a claim has at most 32
/// results): `dra-<uid>-<n>`, an assignment id and a `kubelet:` target for any valid uid. The
/// one place the rule is written; [`claim_of`] reads it back. Both DRA records and the NRI
/// plugin's bookkeeping know a claim's assignments only through these.
pub fn assignment_name(uid: &str, n: usize) -> String {
    format!("dra-{uid}-{n}")
}

/// The claim uid whose device an assignment named `name` holds, when the name follows
/// [`assignment_name`]'s rule.
pub fn claim_of(name: &str) -> Option<&str> {
    let (uid, n) = name.strip_prefix("dra-")?.rsplit_once('-')?;
    (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && valid_uid(uid)).then_some(uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_reads_back_to_its_claim_and_nothing_else_does() {
        let uid = "0b7c2d9e-4f1a-4c3e-9d2b-7a6e5f4c3b2a";
        assert_eq!(claim_of(&assignment_name(uid, 0)), Some(uid));
        assert_eq!(claim_of(&assignment_name(uid, 31)), Some(uid));
        for other in ["app", "dra-", "dra-x", "dra-x-", "dra-x-1a", "dra-a b-0", "web-dra-x-0"] {
            assert_eq!(claim_of(other), None, "{other}");
        }
        assert!(!valid_uid(&"a".repeat(MAX_UID + 1)));
    }
}
