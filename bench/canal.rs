//! The second peer: Alibaba Canal's server (`canal.deployer`) in MQ mode, which reads the binlog
//! and sends each row change of the outbox table to RocketMQ as a flat JSON message, run as a
//! child process on the same database and broker as the relay.
//!
//! Canal 1.1.8 is built from its source (tag `canal-1.1.8`) with Maven, once, into
//! `<cache>/canal-<version>` (the deployer's distribution directory: `bin/`, `conf/`, `lib/`,
//! `plugin/`). Its source comes from `$CANAL_SOURCE` (a git directory holding the tag, or an
//! unpacked source tree) or else a shallow `git clone` of <https://github.com/alibaba/canal>.
//! Each instance has a run directory of its own: `conf/canal.properties` and
//! `conf/<destination>/instance.properties` (the distribution's, with `bench/canal/*.properties`
//! and the lines of the run appended: a later line wins), Canal's position (`meta.dat`) and table
//! meta store (`h2.*.db`) under `conf/<destination>/`, and its logs under `logs/`.
//!
//! Facts that cost time: Maven Central has no Canal 1.1.8 (nothing of 1.1.8 at all; the deployer
//! only up to 1.1.4, as a jar without its launcher's `conf/`), so it is built from source; the
//! build needs all of `admin/`'s poms (the root pom lists `admin`, whose pom lists `admin-ui`)
//! even though only the deployer and the connectors are built, and the deployer pulls every
//! connector (Kafka, RocketMQ, RabbitMQ, Pulsar) into its `plugin/`; the connectors are found
//! through the *first directory on the class path* (its parent's `plugin/`), so the class path
//! starts with the distribution's `bin/` as `startup.sh`'s `.` does; `spring/file-instance.xml`
//! reads `canal.properties` and `<destination>/instance.properties` from the class path, not from
//! `-Dcanal.conf`, so the run's `conf/` is on the class path ahead of the distribution's; Canal
//! sends no key and no property: the event id is only in the body, and one message carries the
//! rows of one binlog rows event that hash to one queue (several events), so the bench counts
//! and times Canal's events by parsing the bodies; with no position stored (`meta.dat`) Canal
//! starts at the end of the binlog (`SHOW MASTER STATUS`, on MySQL 8.4+ `SHOW BINARY LOG
//! STATUS`) and stores one only once a batch was acknowledged, so, as with Debezium, the bench
//! runs it once until a probe event is on the broker before it writes the backlog.

use crate::peer::{mvn, PeerChild, PeerTarget};
use outbox_devenv::cache_dir;
use outbox_devenv::process::free_port;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The Canal release benchmarked.
pub const CANAL_VERSION: &str = "1.1.8";

const CANAL_PROPERTIES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/canal/canal.properties");
const INSTANCE_PROPERTIES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/bench/canal/instance.properties"
);

/// The account Canal reads the binlog as (Canal's quick start: `canal`/`canal`, the
/// distribution's `instance.properties` default), created by [`create_account`].
const ACCOUNT: &str = "canal";

/// The deployer's distribution, built on first use: the source at tag `canal-<version>` into a
/// temporary directory, `mvn package` of the deployer and the RocketMQ connector (and what they
/// need), the deployer's `target/canal/` renamed into place only once complete.
pub fn install() -> PathBuf {
    let home = cache_dir().join(format!("canal-{CANAL_VERSION}"));
    if is_complete(&home) {
        return home;
    }
    let build = PathBuf::from(format!("{}.build", home.display()));
    let _ = std::fs::remove_dir_all(&build);
    std::fs::create_dir_all(&build).unwrap();
    let source = build.join("canal");
    fetch_source(&source);
    eprintln!(
        "building Canal {CANAL_VERSION} with Maven (once, ~2 min on 2 cores) in {} ...",
        build.display()
    );
    // No javadoc: the root pom binds it to every module (its `skip` is the pom's own property
    // `javadoc_skip`, not `maven.javadoc.skip`), and it needs $JAVA_HOME's `javadoc`.
    mvn(
        "build Canal",
        &[
            "-DskipTests".into(),
            "-Djavadoc_skip=true".into(),
            "-f".into(),
            source.join("pom.xml").display().to_string(),
            "-pl".into(),
            "deployer,connector/rocketmq-connector".into(),
            "-am".into(),
            "package".into(),
        ],
    );
    let _ = std::fs::remove_dir_all(&home);
    std::fs::rename(source.join("deployer/target/canal"), &home).unwrap();
    let _ = std::fs::remove_dir_all(&build);
    assert!(
        is_complete(&home),
        "no Canal distribution in {}",
        home.display()
    );
    home
}

fn is_complete(home: &Path) -> bool {
    home.join(format!("lib/canal.deployer-{CANAL_VERSION}.jar"))
        .is_file()
        && home
            .join(format!(
                "plugin/connector.rocketmq-{CANAL_VERSION}-jar-with-dependencies.jar"
            ))
            .is_file()
}

/// Canal's source at tag `canal-<version>` into `into`: from `$CANAL_SOURCE` (a git directory:
/// `git archive`, leaving out the admin UI's bundled Node.js binary, which the build does not
/// need; or a source tree: copied), else a shallow clone from GitHub.
fn fetch_source(into: &Path) {
    let tag = format!("canal-{CANAL_VERSION}");
    let run = |command: &mut Command, what: &str| {
        let status = command.status().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(status.success(), "{what} failed");
    };
    match std::env::var_os("CANAL_SOURCE").map(PathBuf::from) {
        Some(git) if git.join("HEAD").is_file() || git.join(".git").exists() => {
            eprintln!("Canal's source: tag {tag} of {}", git.display());
            std::fs::create_dir_all(into).unwrap();
            // git still prints "invalid object" for the left-out binary when the git
            // directory lacks it (a partial mirror), and exits 0 with everything else.
            run(
                Command::new("sh").arg("-c").arg(format!(
                    "git -C '{}' archive {tag} -- . ':!admin/admin-ui/node' | tar -x -C '{}'",
                    git.display(),
                    into.display()
                )),
                "git archive of Canal's source",
            );
        }
        Some(tree) => {
            eprintln!("Canal's source: {}", tree.display());
            run(
                Command::new("cp").arg("-r").arg(&tree).arg(into),
                "copying Canal's source",
            );
        }
        None => {
            eprintln!("Canal's source: tag {tag} of https://github.com/alibaba/canal ...");
            run(
                Command::new("git")
                    .args(["clone", "-q", "--depth", "1", "--branch", &tag])
                    .arg("https://github.com/alibaba/canal.git")
                    .arg(into),
                "git clone of Canal (set CANAL_SOURCE to a git directory or source tree)",
            );
        }
    }
}

/// Creates Canal's account (quick start: `SELECT, REPLICATION SLAVE, REPLICATION CLIENT`).
pub fn create_account(database: &impl outbox_devenv::SqlServer) {
    for sql in [
        format!("CREATE USER IF NOT EXISTS '{ACCOUNT}'@'%' IDENTIFIED BY '{ACCOUNT}'"),
        format!("GRANT SELECT, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '{ACCOUNT}'@'%'"),
    ] {
        database
            .run_sql_as_root(&sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// Starts Canal in `run_dir` (created if missing; its position is kept there, so a second start
/// resumes where the first stopped). The instance (destination) is named after the topic.
pub fn spawn(home: &Path, run_dir: &Path, target: &PeerTarget) -> PeerChild {
    let conf = run_dir.join("conf");
    let destination = target.topic;
    std::fs::create_dir_all(conf.join(destination)).unwrap();
    std::fs::create_dir_all(run_dir.join("bin")).unwrap();
    // The distribution's Spring and logging files, next to the run's properties.
    for file in ["logback.xml", "spring"] {
        let _ = Command::new("cp")
            .arg("-r")
            .arg(home.join("conf").join(file))
            .arg(&conf)
            .status();
    }
    let append = |defaults: &Path, ours: &str, run: String| {
        let mut text = std::fs::read_to_string(defaults).unwrap();
        text += &format!(
            "\n# bench/canal/{}\n{}",
            Path::new(ours).file_name().unwrap().to_string_lossy(),
            std::fs::read_to_string(ours).unwrap()
        );
        text + "\n# This run.\n" + &run
    };
    let server = append(
        &home.join("conf/canal.properties"),
        CANAL_PROPERTIES,
        format!(
            "canal.conf.dir = {}\n\
             canal.destinations = {destination}\n\
             canal.admin.port = {}\n\
             canal.metrics.pull.port = {}\n\
             rocketmq.namesrv.addr = {}\n",
            conf.display(),
            free_port().unwrap(),
            free_port().unwrap(),
            target.namesrv,
        ),
    );
    std::fs::write(conf.join("canal.properties"), server).unwrap();
    let instance = append(
        &home.join("conf/example/instance.properties"),
        INSTANCE_PROPERTIES,
        format!(
            "canal.instance.master.address = 127.0.0.1:{}\n\
             canal.instance.mysql.slaveId = {}\n\
             canal.instance.filter.regex = {}\\\\.outbox_event\n\
             canal.mq.topic = {}\n",
            target.database_port, target.server_id, target.database, target.topic,
        ),
    );
    std::fs::write(conf.join(destination).join("instance.properties"), instance).unwrap();
    let mut command = Command::new(java());
    // startup.sh's class path and main class (its `.` is `bin/`, the directory whose parent's
    // `plugin/` holds the connectors), with the run's `conf/` ahead of the distribution's. The
    // JVM's defaults otherwise, as for Debezium (startup.sh sets -Xms2g -Xmx3g and G1).
    command
        .arg("-Dfile.encoding=UTF-8")
        .arg("-Djava.net.preferIPv4Stack=true")
        .arg(format!(
            "-Dcanal.conf={}",
            conf.join("canal.properties").display()
        ))
        .arg(format!(
            "-Dlogback.configurationFile={}",
            conf.join("logback.xml").display()
        ))
        .arg("-cp")
        .arg(format!(
            "{}/bin:{}:{}/lib/*",
            home.display(),
            conf.display(),
            home.display()
        ))
        .arg("com.alibaba.otter.canal.deployer.CanalLauncher")
        // logback.xml writes to ../logs.
        .current_dir(run_dir.join("bin"))
        .env_remove("NAMESRV_ADDR");
    let log = run_dir.join("canal.log");
    let _ = std::fs::remove_file(&log);
    PeerChild::start("Canal", command, &log)
}

/// The rows of the outbox's INSERTs a flat message carries, as their `event_id`s (a flat
/// message is `{"data": [{column: value, ...}, ...], "table": ..., "type": ..., ...}`).
pub fn event_ids(body: &[u8]) -> Vec<String> {
    let Ok(message) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Vec::new();
    };
    if message["type"] != "INSERT" || message["table"] != "outbox_event" {
        return Vec::new();
    }
    message["data"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .filter_map(|row| row["event_id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The Java Canal runs on: `$CANAL_JAVA_HOME/bin/java`, else the one Debezium runs on.
pub fn java() -> PathBuf {
    std::env::var_os("CANAL_JAVA_HOME")
        .map(|home| PathBuf::from(home).join("bin/java"))
        .unwrap_or_else(crate::debezium::java)
}

/// The first line of `java -version` of the Java Canal runs on, for the report.
pub fn java_version() -> String {
    crate::peer::java_version(&java())
}
