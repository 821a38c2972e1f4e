//! Deleting a project (spec `12-ref-rest-api.md` *Projects*, `DELETE
//! /v1/projects/{project}`): refused (`409`, naming them) while environments of the
//! project are not destroyed; with `force` each is destroyed through its normal destroy
//! deployment, those are awaited ([`DELETE_WAIT`] at most), and then the project and
//! its history go in one transaction that checks again that nothing new appeared.

use super::{lifecycle, repo, Orchestrator};
use crate::domain::{Deployment, DeploymentStatus, EnvRow, EnvStatus};
use crate::error::ApiError;
use crate::store::{environments, projects};
use sea_orm::TransactionTrait;

/// How long a forced project delete waits for its destroy deployments.
pub const DELETE_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

/// A deleted project: whether its row went, and the destroy deployments it ran.
#[derive(Debug, Clone)]
pub struct ProjectDeleted {
    pub deleted: bool,
    pub destroyed: Vec<Deployment>,
}

impl Orchestrator {
    /// Deletes `project` of `team` (see the module docs). Errors: `409` live
    /// environments without `force`, or environments created while it was deleted;
    /// `502` a destroy that did not succeed (the project is kept, named with the
    /// environment and its deployment).
    pub async fn delete_project(
        &self,
        team: &str,
        project: &projects::Model,
        force: bool,
    ) -> Result<ProjectDeleted, ApiError> {
        let db = self.db();
        let live = |rows: Vec<environments::Model>| -> Vec<environments::Model> {
            rows.into_iter()
                .filter(|e| e.status() != EnvStatus::Destroyed)
                .collect()
        };
        let listing = |envs: &[environments::Model]| {
            envs.iter()
                .map(|e| format!("{} ({}, {})", e.name, e.id, e.status))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let envs = live(repo::envs_of_team(db, team, Some(&project.id), None, true).await?);
        if !envs.is_empty() && !force {
            return Err(ApiError::Conflict(format!(
                "project {} has {} environment(s) that are not destroyed: {}; destroy them first or pass force",
                project.name,
                envs.len(),
                listing(&envs)
            )));
        }
        let mut started = Vec::new();
        for e in &envs {
            let why = lifecycle::reason::PROJECT_DELETED;
            if let Some(d) = self.destroy_env(team, &e.id, why).await? {
                started.push((e.clone(), d.deployment.id));
            }
        }
        let mut destroyed = Vec::new();
        let deadline = tokio::time::Instant::now() + DELETE_WAIT;
        for (e, dep) in started {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let last = self.wait_final(team, &dep, left).await?;
            let d = last.deployment;
            if d.status != DeploymentStatus::Succeeded {
                let why = if d.error.is_empty() {
                    d.status.to_string()
                } else {
                    format!("{}: {}", d.status, d.error)
                };
                return Err(ApiError::BadGateway(format!(
                    "project {} was not deleted: destroying environment {} ({}) with deployment {dep}: {why}",
                    project.name, e.name, e.id
                )));
            }
            destroyed.push(d);
        }
        let txn = db.begin().await?;
        let again = live(repo::envs_of_team(&txn, team, Some(&project.id), None, true).await?);
        if !again.is_empty() {
            return Err(ApiError::Conflict(format!(
                "project {} got environments while it was being deleted: {}",
                project.name,
                listing(&again)
            )));
        }
        let deleted = projects::delete_with_history(&txn, &project.id).await?;
        txn.commit().await?;
        tracing::info!(team, project = %project.id, destroyed = destroyed.len(), "project deleted");
        Ok(ProjectDeleted { deleted, destroyed })
    }
}
