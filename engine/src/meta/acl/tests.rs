use super::*;

fn xattr(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut b = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        b.extend_from_slice(&tag.to_le_bytes());
        b.extend_from_slice(&perm.to_le_bytes());
        b.extend_from_slice(&id.to_le_bytes());
    }
    b
}

const U: u32 = u32::MAX;

fn sample() -> Rule {
    Rule::from_xattr(&xattr(&[
        (TAG_USER_OBJ, 7, U),
        (TAG_USER, 6, 1001),
        (TAG_USER, 4, 1000),
        (TAG_GROUP_OBJ, 5, U),
        (TAG_GROUP, 2, 300),
        (TAG_MASK, 6, U),
        (TAG_OTHER, 1, U),
    ]))
    .unwrap()
}

#[test]
fn the_kernel_form_round_trips_and_named_entries_are_sorted() {
    let r = sample();
    assert_eq!(r.owner, 7);
    assert_eq!(r.group, 5);
    assert_eq!(r.mask, 6);
    assert_eq!(r.other, 1);
    assert_eq!(
        r.named_users,
        vec![
            AclEntry { id: 1000, perm: 4 },
            AclEntry { id: 1001, perm: 6 }
        ]
    );
    assert_eq!(Rule::from_xattr(&r.to_xattr()).unwrap(), r);
    // The stored form too, and JuiceFS's byte layout: big-endian u16s first.
    let enc = r.encode();
    assert_eq!(&enc[..8], &[0, 7, 0, 5, 0, 6, 0, 1]);
    assert_eq!(enc.len(), 16 + 6 * 3);
    assert_eq!(Rule::decode(&enc, "t").unwrap(), r);
    // The mode it summarises: group bits from the mask.
    assert_eq!(r.mode(), 0o761);
}

#[test]
fn bad_kernel_values_are_invalid_not_panics() {
    for bad in [
        vec![],
        vec![2, 0, 0],
        xattr(&[(TAG_USER_OBJ, 7, U)])[..10].to_vec(),
        {
            let mut v = xattr(&[(TAG_USER_OBJ, 7, U)]);
            v[0] = 1;
            v
        },
        xattr(&[(TAG_USER_OBJ, 7, U), (TAG_USER_OBJ, 7, U)]),
        xattr(&[(0x40, 7, U)]),
        xattr(&[(TAG_OTHER, 8, U)]),
        xattr(&[(TAG_USER, 7, 5), (TAG_USER, 6, 5), (TAG_MASK, 7, U)]),
        xattr(&[(TAG_USER_OBJ, 7, U), (TAG_USER, 7, 5), (TAG_OTHER, 0, U)]),
    ] {
        assert!(
            matches!(Rule::from_xattr(&bad), Err(Error::Invalid(_))),
            "{bad:?}"
        );
    }
    // Only the version: remove the ACL.
    assert!(Rule::from_xattr(&xattr(&[])).unwrap().is_empty());
    // Stored values of the wrong shape are corrupt.
    let enc = sample().encode();
    for cut in [0, 7, 16, enc.len() - 1] {
        assert!(matches!(
            Rule::decode(&enc[..cut], "t"),
            Err(Error::Corrupt(_))
        ));
    }
    let mut huge = enc.clone();
    huge[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
    assert!(matches!(Rule::decode(&huge, "t"), Err(Error::Corrupt(_))));
    assert!(decode_named(&[0; 7], "t").is_err());
}

#[test]
fn access_follows_linux_posix_acl_permission() {
    let r = sample(); // owner 100:200
    let check = |uid, gids: &[u32], want| r.permits(uid, gids, 100, 200, want);
    // The owner: the owner entry, unmasked.
    assert!(check(100, &[], 7));
    // Named users: masked (1001 has rw-, mask rw-; 1000 has r--).
    assert!(check(1001, &[], 6));
    assert!(!check(1001, &[], 1));
    assert!(check(1000, &[200], 4));
    assert!(
        !check(1000, &[200], 2),
        "a named user's entry decides, not the group"
    );
    // The owning group: r-x masked by rw- = r--.
    assert!(check(5, &[200], 4));
    assert!(!check(5, &[200], 1));
    // A named group grants what the owning group does not.
    assert!(check(5, &[200, 300], 2));
    // A matching group that grants nothing refuses, other is not tried.
    assert!(!check(5, &[300], 1));
    // Anyone else: other (--x).
    assert!(check(5, &[7], 1));
    assert!(!check(5, &[7], 4));
}

#[test]
fn chmod_inheritance_and_minimal_rules() {
    let mut r = sample();
    r.set_mode(0o640);
    assert_eq!((r.owner, r.group, r.mask, r.other), (6, 5, 4, 0));
    assert_eq!(r.mode(), 0o640);
    // A default ACL applied to a new file created with 0666.
    let c = sample().child_access(0o666);
    assert_eq!((c.owner, c.group, c.mask, c.other), (6, 5, 6, 0));
    assert_eq!(c.mode(), 0o660);
    // Minimal: owner, group, other alone; the mode is the group's perms.
    let mut m = Rule::from_xattr(&xattr(&[
        (TAG_USER_OBJ, 6, U),
        (TAG_GROUP_OBJ, 4, U),
        (TAG_OTHER, 0, U),
    ]))
    .unwrap();
    assert!(m.is_minimal());
    assert_eq!(m.mode(), 0o640);
    m.set_mode(0o755);
    assert_eq!(m.mode(), 0o755);
    let mut partial = Rule::from_xattr(&xattr(&[(TAG_USER, 7, 9), (TAG_MASK, 5, U)])).unwrap();
    partial.inherit_perms(0o751);
    assert_eq!((partial.owner, partial.group, partial.other), (7, 5, 1));
}

#[test]
fn the_cache_finds_rules_both_ways() {
    let c = RuleCache::default();
    assert!(c.get(3).is_none());
    c.put(3, sample());
    assert_eq!(*c.get(3).unwrap(), sample());
    assert_eq!(c.id_of(&sample()), Some(3));
    assert_eq!(c.id_of(&Rule::empty()), None);
}
