//! PostgreSQL and SQLite organizations side by side: the same rows give the same digest
//! hash. Each test starts a private PostgreSQL (`PostgresServer`); where PostgreSQL is not
//! installed the tests say what to install and pass, unless `VIRGA_REQUIRE_POSTGRES` is set
//! (CI sets it, after installing it).

use rand::rngs::SmallRng;
use rand::SeedableRng;

use crate::postgres_server::{find_binaries, INSTALL_HINT};
use crate::schema::{Column, ColumnKind, SharedTable};
use crate::smallbank;
use crate::{Organization, OrganizationError, PostgresOrganization, PostgresServer, SqliteOrganization, Transaction};

/// A running private server and the directory it lives in (dropped in that order).
fn postgres() -> Option<(PostgresServer, tempfile::TempDir)> {
    if find_binaries().is_none() {
        assert!(std::env::var_os("VIRGA_REQUIRE_POSTGRES").is_none(), "{INSTALL_HINT}");
        eprintln!("skipped: {INSTALL_HINT}");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    // Listening on a socket in its own directory only: the port just names the socket.
    let server = PostgresServer::start(dir.path(), 5432).unwrap();
    Some((server, dir))
}

fn loaded<O: Organization>(mut org: O, customers: u64) -> O {
    org.install(&smallbank::tables()).unwrap();
    for block in smallbank::load_blocks(customers, 64) {
        let effects = org.execute_block(&block).unwrap();
        assert!(effects.successful.iter().all(|ok| *ok));
    }
    org
}

#[test]
fn postgres_and_sqlite_reach_the_same_digest_hashes_on_smallbank() {
    let Some((server, _dir)) = postgres() else { return };
    let customers = 150;
    let mut pg = loaded(PostgresOrganization::connect("org-pg", &server.connection_string(), true).unwrap(), customers);
    let mut lite = loaded(SqliteOrganization::in_memory("org-sqlite").unwrap(), customers);
    let mut rng = SmallRng::seed_from_u64(19);
    for number in 0..12 {
        let block = smallbank::random_block(&mut rng, customers, 40);
        let (one, other) = (pg.execute_block(&block).unwrap(), lite.execute_block(&block).unwrap());
        assert_eq!(one.successful, other.successful, "block {number}");
        let (mut a, mut b) = (one.digests.clone(), other.digests.clone());
        for rows in [&mut a, &mut b] {
            rows.sort_by(|x, y| (&x.table, &x.pk, x.serial).cmp(&(&y.table, &y.pk, y.serial)));
        }
        assert_eq!(a, b, "block {number}: the digest rows differ");
        assert_eq!(one.digest_hash(), other.digest_hash(), "block {number}");
    }
}

#[test]
fn nulls_negative_numbers_and_any_text_have_one_image_in_both() {
    let Some((server, _dir)) = postgres() else { return };
    let notes = SharedTable {
        name: "notes".to_string(),
        columns: vec![
            Column::new("id", ColumnKind::Integer),
            Column { nullable: true, ..Column::new("body", ColumnKind::Text) },
            Column { nullable: true, ..Column::new("n", ColumnKind::Integer) },
        ],
        primary_key: "id".to_string(),
        checks: Vec::new(),
    };
    let block = vec![
        Transaction::new(vec![
            "INSERT INTO notes (id, body, n) VALUES (-3, NULL, -9223372036854775807), (0, '', 0), (7, 'a|b~1:x', NULL), \
             (8, 'héllo ✓ ''quoted''', 42)"
                .to_string(),
        ]),
        Transaction::new(vec!["UPDATE notes SET id = 9, n = n + 1 WHERE id = 8".to_string()]),
        Transaction::new(vec!["DELETE FROM notes WHERE id = 0".to_string()]),
    ];
    let mut pg = PostgresOrganization::connect("org-pg", &server.connection_string(), true).unwrap();
    let mut lite = SqliteOrganization::in_memory("org-sqlite").unwrap();
    pg.install(std::slice::from_ref(&notes)).unwrap();
    lite.install(std::slice::from_ref(&notes)).unwrap();
    let (one, other) = (pg.execute_block(&block).unwrap(), lite.execute_block(&block).unwrap());
    let sorted = |mut rows: Vec<virga_ledger::wlc::DigestRow>| {
        rows.sort_by(|x, y| (&x.pk, x.serial, x.op).cmp(&(&y.pk, y.serial, y.op)));
        rows.into_iter().map(|row| (row.pk, row.serial, row.op.letter(), row.image)).collect::<Vec<_>>()
    };
    let expected = vec![
        ("-3".to_string(), 0, "I", "2:-3|~|20:-9223372036854775807".to_string()),
        ("0".to_string(), 0, "I", "1:0|0:|1:0".to_string()),
        ("0".to_string(), 1, "D", "1:0|0:|1:0".to_string()),
        ("7".to_string(), 0, "I", "1:7|7:a|b~1:x|~".to_string()),
        ("8".to_string(), 0, "I", "1:8|16:héllo ✓ 'quoted'|2:42".to_string()),
        ("8".to_string(), 1, "D", "1:8|16:héllo ✓ 'quoted'|2:42".to_string()),
        ("9".to_string(), 0, "U", "1:9|16:héllo ✓ 'quoted'|2:43".to_string()),
    ];
    assert_eq!(sorted(other.digests.clone()), expected, "SQLite");
    assert_eq!(sorted(one.digests.clone()), expected, "PostgreSQL");
    assert_eq!(one.digest_hash(), other.digest_hash());
}

#[test]
fn a_postgres_organization_with_a_disabled_trigger_refuses_to_execute() {
    let Some((server, _dir)) = postgres() else { return };
    let mut pg = loaded(PostgresOrganization::connect("org-pg", &server.connection_string(), false).unwrap(), 10);
    pg.session().batch_execute("ALTER TABLE savings DISABLE TRIGGER chainify_savings").unwrap();
    let error = pg.execute_block(&[smallbank::statements(smallbank::Kind::DepositChecking, 1, 0, 1)]).unwrap_err();
    assert!(matches!(&error, OrganizationError::MissingTrigger { table, .. } if table == "savings"), "{error}");
    pg.session().batch_execute("ALTER TABLE savings ENABLE TRIGGER chainify_savings").unwrap();
    pg.check_installed().unwrap();
}

#[test]
fn a_restored_postgres_checkpoint_brings_back_the_state_its_constraints_and_its_triggers() {
    let Some((server, _dir)) = postgres() else { return };
    let mut admin = postgres::Client::connect(&server.connection_string(), postgres::NoTls).unwrap();
    admin.batch_execute("CREATE DATABASE honest").unwrap();
    admin.batch_execute("CREATE DATABASE restored").unwrap();
    let open = |database: &str| {
        let connection = server.database(database);
        loaded(PostgresOrganization::connect(database, &connection, false).unwrap(), crate::tests::CUSTOMERS)
    };
    crate::tests::checkpoint_round_trip(open("honest"), open("restored"));
}

#[test]
fn staged_execution_over_several_connections_gives_the_effects_of_serial_execution() {
    let Some((server, _dir)) = postgres() else { return };
    let mut admin = postgres::Client::connect(&server.connection_string(), postgres::NoTls).unwrap();
    admin.batch_execute("CREATE DATABASE serial").unwrap();
    admin.batch_execute("CREATE DATABASE staged").unwrap();
    let url = |database: &str| server.database(database);
    let customers = 40;
    let mut serial = loaded(PostgresOrganization::connect("serial", &url("serial"), false).unwrap(), customers);
    let mut staged =
        loaded(PostgresOrganization::connect_with_workers("staged", &url("staged"), false, 3).unwrap(), customers);
    let mut rng = SmallRng::seed_from_u64(29);
    for number in 0..8 {
        let block = smallbank::random_block(&mut rng, customers, 60);
        let (one, other) = (serial.execute_block(&block).unwrap(), staged.execute_block(&block).unwrap());
        assert_eq!(one.successful, other.successful, "block {number}");
        assert_eq!(one.digest_hash(), other.digest_hash(), "block {number}");
    }
    assert_eq!(serial.state_hash().unwrap(), staged.state_hash().unwrap());
}
