//! The peer users would pick instead of the relay: Debezium Server (its MariaDB or MySQL
//! connector, the outbox event router, the RocketMQ sink), run as a child process on the same
//! database and broker as the relay.
//!
//! The distribution comes from Maven Central through `bench/debezium/pom.xml` and is unpacked
//! once into `<cache>/debezium-server-<version>`. Each instance has a run directory of its own:
//! `config/application.properties` (`bench/debezium/application.properties`, which holds every
//! setting the bench changes from Debezium's defaults, plus the lines of this run: ports,
//! database, files), the offsets and the schema history.
//!
//! Facts that cost time: Debezium 3.x needs Java 21 or newer (class file 65), and on Java 25
//! Quarkus needs `--add-opens java.base/java.lang=ALL-UNNAMED`; with `snapshot.mode=no_data` no
//! offset is written until a record went out, so a backlog written after a first start that
//! sent nothing is skipped by the next start (the bench sends a probe first); a failed send
//! ends the process with exit code 0 (the bench treats any exit as a failure).

use crate::peer::{mvn, PeerChild, PeerTarget};
use outbox_devenv::{cache_dir, DatabaseKind};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The Debezium release benchmarked; keep it equal to the version in `bench/debezium/pom.xml`.
pub const DEBEZIUM_VERSION: &str = "3.6.1.Final";

const POM: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/debezium/pom.xml");
const PROPERTIES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/bench/debezium/application.properties"
);

/// The unpacked distribution (`debezium-server/` with its runner jar and `lib/`), fetched on
/// first use: `mvn dependency:unpack-dependencies` on our pom, into a temporary directory that
/// is renamed into place only once complete.
pub fn install() -> PathBuf {
    let root = cache_dir().join(format!("debezium-server-{DEBEZIUM_VERSION}"));
    let home = root.join("debezium-server");
    if runner_jar(&home).is_file() {
        return home;
    }
    eprintln!(
        "fetching Debezium Server {DEBEZIUM_VERSION} from Maven Central (~780 MB, once) into {} ...",
        root.display()
    );
    let partial = PathBuf::from(format!("{}.partial", root.display()));
    let _ = std::fs::remove_dir_all(&partial);
    mvn(
        "fetch Debezium Server",
        &[
            "-f".into(),
            POM.into(),
            "dependency:unpack-dependencies".into(),
            format!("-DoutputDirectory={}", partial.display()),
            // The plugin's "already unpacked" markers, kept out of the source tree.
            format!("-DmarkersDirectory={}/.markers", partial.display()),
        ],
    );
    let _ = std::fs::remove_dir_all(&root);
    std::fs::rename(&partial, &root).unwrap();
    assert!(
        runner_jar(&home).is_file(),
        "no runner jar in {}",
        home.display()
    );
    home
}

fn runner_jar(home: &Path) -> PathBuf {
    home.join(format!(
        "debezium-server-dist-{DEBEZIUM_VERSION}-runner.jar"
    ))
}

/// Starts Debezium Server in `run_dir` (created if missing; offsets and schema history kept
/// there, so a second start resumes where the first stopped).
pub fn spawn(home: &Path, run_dir: &Path, target: &PeerTarget) -> PeerChild {
    std::fs::create_dir_all(run_dir.join("config")).unwrap();
    let connector = match target.database_kind {
        DatabaseKind::MariaDb => "io.debezium.connector.mariadb.MariaDbConnector",
        DatabaseKind::MySql => "io.debezium.connector.mysql.MySqlConnector",
    };
    let http_port = outbox_devenv::process::free_port().unwrap();
    let mut properties = std::fs::read_to_string(PROPERTIES).unwrap();
    // For experiments with Debezium's own knobs (e.g. `debezium.source.poll.interval.ms=10`);
    // the report names them.
    if let Some(extra) = extra_properties() {
        properties += &format!("\n# $DEBEZIUM_EXTRA_PROPERTIES\n{extra}\n");
    }
    properties += &format!(
        "\n# This run.\n\
             debezium.sink.rocketmq.producer.name.srv.addr={}\n\
             debezium.source.connector.class={connector}\n\
             debezium.source.database.port={}\n\
             debezium.source.database.server.id={}\n\
             debezium.source.database.include.list={db}\n\
             debezium.source.table.include.list={db}.outbox_event\n\
             debezium.source.offset.storage.file.filename={}\n\
             debezium.source.schema.history.internal.file.filename={}\n\
             quarkus.http.port={http_port}\n",
        target.namesrv,
        target.database_port,
        target.server_id,
        run_dir.join("offsets.dat").display(),
        run_dir.join("schema-history.dat").display(),
        db = target.database,
    );
    std::fs::write(run_dir.join("config/application.properties"), properties).unwrap();
    let mut command = Command::new(java());
    // run.sh's class path and main class, without its JMX/metrics agents (off by default);
    // the JVM's defaults otherwise (heap: a quarter of RAM).
    command
        .args(["--add-opens", "java.base/java.lang=ALL-UNNAMED"])
        .arg("-cp")
        .arg(format!(
            "{}:{}/config/lib:{}/lib/*",
            runner_jar(home).display(),
            home.display(),
            home.display()
        ))
        .arg("io.debezium.server.Main")
        .current_dir(run_dir)
        .env_remove("NAMESRV_ADDR");
    let log = run_dir.join("debezium.log");
    let _ = std::fs::remove_file(&log);
    PeerChild::start("Debezium Server", command, &log)
}

/// `$DEBEZIUM_EXTRA_PROPERTIES`: property lines (`;`-separated) appended to every instance's
/// configuration, after the bench's own.
pub fn extra_properties() -> Option<String> {
    let extra = std::env::var("DEBEZIUM_EXTRA_PROPERTIES").ok()?;
    let lines: Vec<&str> = extra
        .split(';')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// A Java of 21 or newer: `$DEBEZIUM_JAVA_HOME/bin/java`, else the machine's Temurin 25, else
/// a JDK 21 under `/usr/lib/jvm`.
pub fn java() -> PathBuf {
    let mut candidates: Vec<PathBuf> = std::env::var_os("DEBEZIUM_JAVA_HOME")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    candidates.push(PathBuf::from("/usr/lib/jvm/temurin-25-jdk-amd64"));
    if let Ok(entries) = std::fs::read_dir("/usr/lib/jvm") {
        let mut others: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                let name = p.file_name().unwrap().to_string_lossy().to_string();
                ["-21", "-22", "-23", "-24", "-25"]
                    .iter()
                    .any(|v| name.contains(v))
            })
            .collect();
        others.sort();
        candidates.extend(others.into_iter().rev());
    }
    candidates
        .into_iter()
        .map(|home| home.join("bin/java"))
        .find(|java| java.is_file())
        .unwrap_or_else(|| {
            panic!(
                "Debezium {DEBEZIUM_VERSION} needs Java 21 or newer: none under /usr/lib/jvm; \
                 set DEBEZIUM_JAVA_HOME"
            )
        })
}

/// The first line of `java -version` of the Java Debezium runs on, for the report.
pub fn java_version() -> String {
    crate::peer::java_version(&java())
}
