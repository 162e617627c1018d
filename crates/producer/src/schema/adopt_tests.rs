use super::*;
use crate::schema::shape::{ExistingColumn, ExistingIndex, TableShape};

fn col(
    name: &str,
    data_type: &str,
    column_type: &str,
    max: Option<u64>,
    nullable: bool,
) -> ExistingColumn {
    ExistingColumn {
        name: name.into(),
        data_type: data_type.into(),
        column_type: column_type.into(),
        max_chars: max,
        nullable,
        // The server fills these (the article's DDL has them so).
        has_default: ["next_retry_at", "created_at", "status", "retry_count"].contains(&name),
        auto_increment: name == "id",
    }
}

fn idx(name: &str, columns: &[&str], unique: bool) -> ExistingIndex {
    ExistingIndex {
        name: name.into(),
        columns: columns.iter().map(|c| c.to_string()).collect(),
        unique,
    }
}

/// The reference article's `outbox_event` as MySQL describes it ("最小上手").
fn article_table(rows: u64) -> TableShape {
    TableShape {
        columns: vec![
            col("id", "bigint", "bigint", None, false),
            col("event_id", "varchar", "varchar(64)", Some(64), false),
            col("biz_key", "varchar", "varchar(64)", Some(64), false),
            col("topic", "varchar", "varchar(128)", Some(128), false),
            col("payload", "json", "json", None, false),
            col("status", "tinyint", "tinyint", None, false),
            col("retry_count", "int", "int", None, false),
            col("next_retry_at", "datetime", "datetime(3)", None, false),
            col("lease_until", "datetime", "datetime(3)", None, true),
            col("created_at", "datetime", "datetime(3)", None, false),
        ],
        indexes: vec![
            idx("PRIMARY", &["id"], true),
            idx("uk_event_id", &["event_id"], true),
            idx("idx_pending", &["status", "next_retry_at"], false),
        ],
        estimated_rows: rows,
    }
}

fn table() -> TableName {
    TableName::parse("outbox_event").unwrap()
}

#[test]
fn the_article_table_gets_the_relay_columns_and_indexes_and_keeps_its_own() {
    let plan = TablePlan::compare(&table(), &article_table(57), OnlineRule::default());
    let columns: Vec<&str> = plan.add_columns.iter().map(|c| c.name).collect();
    assert_eq!(
        columns,
        [
            "tags",
            "headers",
            "owner",
            "msg_id",
            "sent_at",
            "last_error",
            "updated_at",
            "deliver_at"
        ]
    );
    let indexes: Vec<&str> = plan.add_indexes.iter().map(|i| i.name).collect();
    assert_eq!(indexes, ["idx_created", "idx_waiting_key"]);
    assert!(plan.refusals.is_empty(), "{:?}", plan.refusals);
    // Its idx_pending (status, next_retry_at) leads with status: used as it is, noted.
    assert_eq!(plan.notes.len(), 1);
    assert!(plan.notes[0].contains("idx_pending"), "{}", plan.notes[0]);
    let statements = plan.statements();
    assert_eq!(statements.len(), 2);
    assert!(statements[0]
        .starts_with("ALTER TABLE `outbox_event`\n  ADD COLUMN `tags` VARCHAR(128) NULL,\n"));
    assert!(statements[0].ends_with("ALGORITHM=INSTANT"));
    assert!(statements[1].contains("ADD INDEX `idx_waiting_key` (`topic`, `biz_key`)"));
    assert!(statements[1].ends_with("ALGORITHM=INPLACE, LOCK=NONE"));
    assert!(statements
        .iter()
        .all(|s| !s.contains("DROP") && !s.contains("MODIFY")));
    let blocked = plan
        .blocks_run()
        .expect("the relay cannot run without the columns");
    assert!(
        blocked.contains(
            "lacks the column(s) tags, headers, owner, msg_id, sent_at, last_error, deliver_at."
        ),
        "{blocked}"
    );
    assert!(blocked.contains("outbox-relay migrate"), "{blocked}");
}

#[test]
fn a_complete_table_needs_nothing() {
    let mut shape = article_table(10);
    for c in super::COLUMNS {
        if shape.column(c.name).is_none() {
            shape
                .columns
                .push(col(c.name, "varchar", "varchar(1024)", Some(1024), true));
        }
    }
    // Types of the relay's own columns, as a table migrate made has them.
    for (name, t) in [
        ("sent_at", "datetime"),
        ("updated_at", "datetime"),
        ("deliver_at", "timestamp"),
    ] {
        let c = shape.columns.iter_mut().find(|c| c.name == name).unwrap();
        c.data_type = t.into();
    }
    for name in ["msg_id", "sent_at"] {
        let c = shape.columns.iter_mut().find(|c| c.name == name).unwrap();
        (c.nullable, c.has_default) = (false, true);
        if name == "msg_id" {
            (c.data_type, c.column_type, c.max_chars) =
                ("char".into(), "char(64)".into(), Some(64));
        }
    }
    shape
        .indexes
        .push(idx("idx_created", &["created_at"], false));
    shape
        .indexes
        .push(idx("idx_waiting_key", &["topic", "biz_key"], false));
    shape.indexes[2] = idx("idx_pending", &["status", "topic"], false);
    let plan = TablePlan::compare(&table(), &shape, OnlineRule::default());
    assert!(plan.is_empty(), "{plan:?}");
    assert!(plan.statements().is_empty());
    assert_eq!(plan.blocks_run(), None);
    assert_eq!(plan.slows_run(), None);
}

#[test]
fn an_incompatible_column_is_refused_with_the_statement_to_run() {
    let mut shape = article_table(10);
    shape.columns[5] = col("status", "varchar", "varchar(16)", Some(16), false);
    let plan = TablePlan::compare(&table(), &shape, OnlineRule::default());
    assert!(plan.is_refused());
    let refusal = &plan.refusals[0];
    assert!(
        refusal.reason.contains("`status` is varchar(16)"),
        "{}",
        refusal.reason
    );
    assert_eq!(
        refusal.statement,
        "ALTER TABLE `outbox_event` MODIFY COLUMN `status` TINYINT NOT NULL DEFAULT 0"
    );
    let mut rendered = String::new();
    plan.render(&mut rendered);
    assert!(
        rendered.contains("nothing is changed on outbox_event"),
        "{rendered}"
    );
    assert!(
        !rendered.lines().any(|l| l.starts_with("ALTER")),
        "{rendered}"
    );
}

#[test]
fn a_missing_producer_column_is_refused_not_invented() {
    let mut shape = article_table(10);
    shape.columns.retain(|c| c.name != "biz_key");
    let plan = TablePlan::compare(&table(), &shape, OnlineRule::default());
    assert!(plan.is_refused());
    assert!(plan.refusals[0].reason.contains("`biz_key` is missing"));
    assert!(plan.add_columns.iter().all(|c| c.name != "biz_key"));
}

#[test]
fn a_not_null_column_the_relay_clears_is_refused() {
    let mut shape = article_table(10);
    shape.columns[8].nullable = false; // lease_until
    let plan = TablePlan::compare(&table(), &shape, OnlineRule::default());
    assert!(plan.refusals[0]
        .reason
        .contains("`lease_until` is NOT NULL"));
}

#[test]
fn an_index_build_on_a_table_over_the_rule_is_left_to_the_operator() {
    let rule = OnlineRule {
        max_rows: Some(1_000),
    };
    let plan = TablePlan::compare(&table(), &article_table(5_000), rule);
    assert!(plan.is_refused());
    let refusal = plan.refusals.last().unwrap();
    assert_eq!(refusal.kind, RefusalKind::TooLarge);
    assert!(
        refusal.reason.contains("about 5000 rows"),
        "{}",
        refusal.reason
    );
    assert_eq!(refusal.statement, plan.statements().join(";\n"));
    // Under the rule, or with no rule, the same table is adopted.
    assert!(!TablePlan::compare(&table(), &article_table(999), rule).is_refused());
    let unlimited = OnlineRule { max_rows: None };
    assert!(!TablePlan::compare(&table(), &article_table(5_000), unlimited).is_refused());
}

#[test]
fn an_index_with_the_relays_columns_under_another_name_serves() {
    let mut shape = article_table(10);
    shape.indexes[1] = idx("uq_event", &["event_id"], true);
    shape
        .indexes
        .push(idx("by_created", &["created_at", "status"], false));
    let plan = TablePlan::compare(&table(), &shape, OnlineRule::default());
    let indexes: Vec<&str> = plan.add_indexes.iter().map(|i| i.name).collect();
    // `idx_waiting_key` is named by the relay's queries: it is added whatever else exists.
    assert_eq!(indexes, ["idx_waiting_key"]);
}

#[test]
fn a_name_taken_by_another_index_slows_the_relay_but_does_not_stop_it() {
    let mut shape = article_table(10);
    shape.indexes[2] = idx("idx_pending", &["created_at"], false);
    let plan = TablePlan::compare(&table(), &shape, OnlineRule::default());
    assert!(!plan.is_refused());
    assert_eq!(plan.refusals[0].kind, RefusalKind::Index);
    assert!(plan.refusals[0]
        .statement
        .contains("RENAME INDEX idx_pending TO idx_pending_old"));
    assert!(plan.slows_run().unwrap().contains("idx_pending"));
}

#[test]
fn a_partitioned_tables_non_unique_event_id_index_serves() {
    // `partitions convert` swaps uk_event_id for the non-unique idx_event_id.
    let mut shape = article_table(10);
    shape.indexes[1] = idx("idx_event_id", &["event_id"], false);
    let plan = TablePlan::compare(&table(), &shape, OnlineRule::default());
    assert!(
        plan.add_indexes.iter().all(|i| i.name != "uk_event_id"),
        "{plan:?}"
    );
}

#[test]
fn a_table_without_updated_at_runs_with_a_warning() {
    // Every column the relay reads and writes, none that only operator commands read.
    let mut shape = article_table(10);
    for c in super::COLUMNS.iter().filter(|c| c.name != "updated_at") {
        if shape.column(c.name).is_none() {
            shape
                .columns
                .push(col(c.name, "varchar", "varchar(1024)", Some(1024), true));
        }
    }
    for (name, t) in [("sent_at", "datetime"), ("deliver_at", "timestamp")] {
        let c = shape.columns.iter_mut().find(|c| c.name == name).unwrap();
        c.data_type = t.into();
    }
    let plan = TablePlan::compare(&table(), &shape, OnlineRule::default());
    assert_eq!(plan.add_columns.len(), 1);
    assert_eq!(plan.blocks_run(), None);
    assert!(plan
        .slows_run()
        .unwrap()
        .contains("column updated_at is missing"));
}

#[test]
fn a_primary_key_must_start_with_id() {
    // `partitions convert` makes it (id, created_at): fine.
    let mut shape = article_table(10);
    shape.indexes[0] = idx("PRIMARY", &["id", "created_at"], true);
    assert!(!TablePlan::compare(&table(), &shape, OnlineRule::default()).is_refused());
    shape.indexes[0] = idx("PRIMARY", &["event_id"], true);
    let plan = TablePlan::compare(&table(), &shape, OnlineRule::default());
    assert!(plan.is_refused());
    assert_eq!(
        plan.refusals[0].statement,
        "ALTER TABLE `outbox_event` DROP PRIMARY KEY, ADD PRIMARY KEY (`id`)"
    );
    shape.indexes.remove(0);
    let plan = TablePlan::compare(&table(), &shape, OnlineRule::default());
    assert_eq!(
        plan.refusals[0].statement,
        "ALTER TABLE `outbox_event` ADD PRIMARY KEY (`id`)"
    );
}

#[test]
fn a_not_null_column_the_marker_or_resend_clears_is_refused() {
    // The marker sets `last_error = NULL` when an event is SENT; `resend` clears msg_id, sent_at.
    for name in ["last_error", "msg_id", "sent_at"] {
        let mut shape = article_table(10);
        shape
            .columns
            .push(col(name, "datetime", "datetime(3)", None, false));
        if name != "sent_at" {
            let c = shape.columns.last_mut().unwrap();
            (c.data_type, c.column_type, c.max_chars) =
                ("varchar".into(), "varchar(1024)".into(), Some(1024));
        }
        let plan = TablePlan::compare(&table(), &shape, OnlineRule::default());
        assert!(plan.is_refused(), "{name}: {plan:?}");
        assert!(
            plan.refusals[0]
                .reason
                .contains(&format!("`{name}` is NOT NULL")),
            "{}",
            plan.refusals[0].reason
        );
    }
}

#[test]
fn a_not_null_msg_id_or_sent_at_with_a_default_serves() {
    // `resend` sets them back to their defaults: a default will do where NULL is not allowed.
    for name in ["msg_id", "sent_at"] {
        let mut shape = article_table(10);
        let mut c = match name {
            "msg_id" => col(name, "char", "char(64)", Some(64), false),
            _ => col(name, "datetime", "datetime(3)", None, false),
        };
        c.has_default = true;
        shape.columns.push(c);
        let plan = TablePlan::compare(&table(), &shape, OnlineRule::default());
        assert!(!plan.is_refused(), "{name}: {plan:?}");
    }
}

/// The article table with every relay column as migration 0001 made them: `msg_id` and
/// `sent_at` nullable.
fn table_of_migration_0001(rows: u64) -> TableShape {
    let mut shape = article_table(rows);
    for c in super::COLUMNS {
        if shape.column(c.name).is_none() {
            let (t, ct, max) = match c.kind {
                crate::schema::shape::ColumnKind::Time => ("datetime", "datetime(3)", None),
                _ => ("varchar", "varchar(1024)", Some(1024)),
            };
            shape.columns.push(col(c.name, t, ct, max, true));
        }
    }
    shape.indexes[2] = idx("idx_pending", &["status", "topic"], false);
    for (name, columns) in [
        ("idx_created", &["created_at"][..]),
        ("idx_waiting_key", &["topic", "biz_key"][..]),
    ] {
        shape.indexes.push(idx(name, columns, false));
    }
    shape
}

#[test]
fn nullable_msg_id_and_sent_at_are_stored_at_full_size() {
    let shape = table_of_migration_0001(50);
    assert!(!shape.sent_in_place());
    let plan = TablePlan::compare(&table(), &shape, OnlineRule::default());
    assert_eq!(plan.sent_columns, SentColumns::Convert);
    assert!(!plan.is_empty() && !plan.is_refused());
    let statements = plan.statements();
    assert_eq!(statements.len(), 3, "{statements:#?}");
    assert!(
        statements[0].contains("ALTER COLUMN `msg_id` SET DEFAULT ''")
            && statements[0].contains("ALTER COLUMN `sent_at` SET DEFAULT '1970-01-01 00:00:00'"),
        "{}",
        statements[0]
    );
    assert!(statements[1].starts_with("UPDATE `outbox_event` SET `msg_id` = COALESCE("));
    assert!(
        statements[2].contains("MODIFY COLUMN `msg_id` CHAR(64) NOT NULL DEFAULT ''")
            && statements[2].contains(
                "MODIFY COLUMN `sent_at` DATETIME(3) NOT NULL DEFAULT '1970-01-01 00:00:00'"
            ),
        "{}",
        statements[2]
    );
    assert_eq!(plan.blocks_run(), None);
    assert!(plan.slows_run().unwrap().contains("msg_id and sent_at"));
}

#[test]
fn a_table_over_a_tenth_of_the_rule_keeps_msg_id_and_sent_at_with_a_note() {
    let rule = OnlineRule {
        max_rows: Some(1_000),
    };
    let plan = TablePlan::compare(&table(), &table_of_migration_0001(101), rule);
    assert_eq!(plan.sent_columns, SentColumns::Left);
    assert!(plan.is_empty(), "nothing for migrate to do: {plan:?}");
    assert!(plan.statements().is_empty());
    assert!(
        plan.notes.iter().any(|n| n.contains("about 101 rows")
            && n.contains("blocks writes")
            && n.contains("MODIFY COLUMN `msg_id` CHAR(64)")),
        "{:?}",
        plan.notes
    );
    assert!(plan.slows_run().unwrap().contains("msg_id and sent_at"));
    // Under a tenth, or with no rule, migrate converts it.
    let small = TablePlan::compare(&table(), &table_of_migration_0001(100), rule);
    assert_eq!(small.sent_columns, SentColumns::Convert);
    let unlimited = OnlineRule { max_rows: None };
    let big = TablePlan::compare(&table(), &table_of_migration_0001(10_000_000), unlimited);
    assert_eq!(big.sent_columns, SentColumns::Convert);
}

#[test]
fn a_retired_index_on_another_outbox_table_is_noted_with_its_drop_never_dropped() {
    // A table made `LIKE outbox_event` before migration 0015 still has idx_status_created.
    let mut shape = table_of_migration_0001(50);
    shape
        .indexes
        .push(idx("idx_status_created", &["status", "created_at"], false));
    let orders = TableName::parse("orders_outbox").unwrap();
    let plan = TablePlan::compare(&orders, &shape, OnlineRule::default());
    assert!(
        plan.notes.iter().any(|n| n.contains("idx_status_created")
            && n.contains("ALTER TABLE `orders_outbox` DROP INDEX idx_status_created")),
        "{:?}",
        plan.notes
    );
    assert!(plan.statements().iter().all(|s| !s.contains("DROP")));
    // The same name on other columns is the operator's own index: not ours to judge.
    shape.indexes.last_mut().unwrap().columns = vec!["created_at".into(), "status".into()];
    let plan = TablePlan::compare(&orders, &shape, OnlineRule::default());
    assert!(plan.notes.iter().all(|n| !n.contains("idx_status_created")));
    // On outbox_event itself migration 0015 drops it: no note.
    shape.indexes.last_mut().unwrap().columns = vec!["status".into(), "created_at".into()];
    let plan = TablePlan::compare(&table(), &shape, OnlineRule::default());
    assert!(plan.notes.iter().all(|n| !n.contains("idx_status_created")));
}

#[test]
fn a_table_whose_rows_could_never_be_claimed_is_refused_with_the_fix() {
    let mut shape = article_table(10);
    for column in &mut shape.columns {
        match column.name.as_str() {
            "id" => column.auto_increment = false,
            "next_retry_at" => column.nullable = true,
            "created_at" => column.has_default = false,
            _ => {}
        }
    }
    let plan = TablePlan::compare(&table(), &shape, OnlineRule::default());
    assert!(plan.is_refused());
    let refused: Vec<(&str, &str)> = (plan.refusals.iter())
        .map(|r| (r.reason.as_str(), r.statement.as_str()))
        .collect();
    assert_eq!(refused.len(), 3, "{refused:?}");
    assert!(
        refused[0].0.contains("`id` has no AUTO_INCREMENT"),
        "{refused:?}"
    );
    assert!(refused[0].1.contains("AUTO_INCREMENT"), "{refused:?}");
    assert!(
        refused[1].0.contains("`next_retry_at` is nullable"),
        "{refused:?}"
    );
    assert!(
        refused[1].1.contains(
            "SET `next_retry_at` = COALESCE(created_at, NOW(3)) WHERE `next_retry_at` IS NULL"
        ) && refused[1]
            .1
            .contains("NOT NULL DEFAULT CURRENT_TIMESTAMP(3)"),
        "{refused:?}"
    );
    assert!(
        refused[2].0.contains("`created_at` is without a default"),
        "{refused:?}"
    );
    // The relay still runs on it (the stream reads such rows), warned (it is held back only by
    // the relay's columns the article's table lacks).
    assert!(plan
        .blocks_run()
        .is_none_or(|blocked| !blocked.contains("never claimed")));
    assert!(plan
        .slows_run()
        .is_some_and(|w| w.contains("never claimed")));
}
