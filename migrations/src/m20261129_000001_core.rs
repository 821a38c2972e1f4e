//! Core tables: teams, users, memberships, api keys, sessions, device codes, projects,
//! environments, versions, deployments, phases, events, sources, installations.

use crate::util::{big, boolean, id, index, int, string, text, text_pk};
use sea_orm_migration::prelude::*;

/// The core schema.
#[derive(DeriveMigrationName)]
pub struct Migration;

fn table(name: &'static str, cols: Vec<ColumnDef>) -> TableCreateStatement {
    let mut t = Table::create();
    t.table(id(name)).if_not_exists();
    for mut c in cols {
        t.col(&mut c);
    }
    t.to_owned()
}

fn tables() -> Vec<(TableCreateStatement, Vec<IndexCreateStatement>)> {
    vec![
        (
            table(
                "teams",
                vec![text_pk("id"), string("name"), string("created_at")],
            ),
            vec![],
        ),
        (
            table(
                "users",
                vec![
                    text_pk("id"),
                    big("github_id"),
                    string("login"),
                    string("name"),
                    string("email"),
                    string("created_at"),
                ],
            ),
            vec![
                index("users", &["email"], false),
                index("users", &["github_id"], false),
            ],
        ),
        (
            {
                let mut t = table(
                    "memberships",
                    vec![
                        string("team_id"),
                        string("user_id"),
                        string("role"),
                        string("created_at"),
                    ],
                );
                t.primary_key(Index::create().col(id("team_id")).col(id("user_id")));
                t
            },
            vec![index("memberships", &["user_id"], false)],
        ),
        (
            table(
                "api_keys",
                vec![
                    text_pk("id"),
                    string("team_id"),
                    string("name"),
                    string("hash"),
                    string("created_by"),
                    string("created_at"),
                    string("last_used_at"),
                    string("revoked_at"),
                ],
            ),
            vec![
                index("api_keys", &["hash"], true),
                index("api_keys", &["team_id"], false),
            ],
        ),
        (
            table(
                "sessions",
                vec![
                    text_pk("id"),
                    string("hash"),
                    string("user_id"),
                    string("created_at"),
                    string("expires_at"),
                ],
            ),
            vec![index("sessions", &["hash"], true)],
        ),
        (
            table(
                "device_codes",
                vec![
                    text_pk("id"),
                    string("hash"),
                    string("user_code"),
                    string("status"),
                    string("team_id"),
                    string("key_id"),
                    string("approved_by"),
                    string("created_at"),
                    string("expires_at"),
                ],
            ),
            vec![
                index("device_codes", &["hash"], true),
                index("device_codes", &["user_code"], false),
            ],
        ),
        (
            table(
                "projects",
                vec![
                    text_pk("id"),
                    string("team_id"),
                    string("name"),
                    string("kind"),
                    string("source"),
                    string("created_at"),
                ],
            ),
            vec![index("projects", &["team_id", "name"], true)],
        ),
        (
            table(
                "environments",
                vec![
                    text_pk("id"),
                    string("project_id"),
                    string("team_id"),
                    string("name"),
                    string("stage"),
                    string("host_id"),
                    string("parent_version_id"),
                    string("current_version_id"),
                    string("status"),
                    text("endpoints"),
                    string("created_at"),
                ],
            ),
            vec![
                index("environments", &["project_id", "name"], false),
                index("environments", &["team_id"], false),
                index("environments", &["host_id"], false),
            ],
        ),
        (
            table(
                "versions",
                vec![
                    text_pk("id"),
                    string("project_id"),
                    string("env_id"),
                    string("team_id"),
                    int("number"),
                    text("spec"),
                    string("snapshot"),
                    boolean("healthy"),
                    string("created_at"),
                ],
            ),
            vec![index("versions", &["env_id"], false)],
        ),
        (
            table(
                "deployments",
                vec![
                    text_pk("id"),
                    string("project_id"),
                    string("env_id"),
                    string("team_id"),
                    string("kind"),
                    string("status"),
                    string("version_id"),
                    string("target_env_id"),
                    text("params"),
                    text("error"),
                    string("created_at"),
                    string("finished_at"),
                ],
            ),
            vec![
                index("deployments", &["env_id"], false),
                index("deployments", &["status"], false),
            ],
        ),
        (
            {
                let mut t = table(
                    "phases",
                    vec![
                        string("deployment_id"),
                        int("seq"),
                        string("name"),
                        string("status"),
                        text("evidence"),
                        text("error"),
                        string("started_at"),
                        string("finished_at"),
                    ],
                );
                t.primary_key(Index::create().col(id("deployment_id")).col(id("seq")));
                t
            },
            vec![],
        ),
        (
            table(
                "events",
                vec![
                    text_pk("id"),
                    string("team_id"),
                    string("subject"),
                    string("kind"),
                    text("body"),
                    string("at"),
                ],
            ),
            vec![index("events", &["team_id", "subject"], false)],
        ),
        (
            table(
                "sources",
                vec![
                    text_pk("project_id"),
                    string("team_id"),
                    string("repo"),
                    string("default_branch"),
                    string("compose_path"),
                    big("installation_id"),
                    boolean("deploy_branches"),
                    string("last_deployed_sha"),
                ],
            ),
            vec![index("sources", &["repo"], false)],
        ),
        (
            {
                let mut t = table(
                    "installations",
                    vec![
                        big("installation_id"),
                        string("team_id"),
                        string("account_login"),
                        string("created_at"),
                    ],
                );
                t.primary_key(Index::create().col(id("installation_id")));
                t
            },
            vec![],
        ),
    ]
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for (t, indexes) in tables() {
            manager.create_table(t).await?;
            for i in indexes {
                manager.create_index(i).await?;
            }
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for name in [
            "installations",
            "sources",
            "events",
            "phases",
            "deployments",
            "versions",
            "environments",
            "projects",
            "device_codes",
            "sessions",
            "api_keys",
            "memberships",
            "users",
            "teams",
        ] {
            manager
                .drop_table(Table::drop().table(id(name)).if_exists().to_owned())
                .await?;
        }
        Ok(())
    }
}
