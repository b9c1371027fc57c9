"""foundation schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Tables of the foundation: tenants and API keys, sessions with artifacts, provenance edges and checkpoints,
memory records with per-key versions and tombstones, forget jobs and webhook deliveries.
"""

from __future__ import annotations

from collections.abc import Sequence

import pgvector.sqlalchemy
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")
    op.create_table('tenants',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('webhook_secret', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tenants')),
    sa.UniqueConstraint('name', name=op.f('uq_tenants_name'))
    )
    op.create_table('api_keys',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('tenant_id', sa.String(length=40), nullable=False),
    sa.Column('key_sha256', sa.String(length=64), nullable=False),
    sa.Column('label', sa.String(length=200), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_api_keys_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_keys')),
    sa.UniqueConstraint('key_sha256', name=op.f('uq_api_keys_key_sha256'))
    )
    op.create_index(op.f('ix_api_keys_tenant_id'), 'api_keys', ['tenant_id'], unique=False)
    op.create_table('forget_jobs',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('tenant_id', sa.String(length=40), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('strategy', sa.String(length=40), nullable=False),
    sa.Column('target', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('idempotency_key', sa.String(length=200), nullable=True),
    sa.Column('receipt', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('lease_owner', sa.String(length=100), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("status IN ('queued', 'running', 'succeeded', 'failed', 'needs_input')", name=op.f('ck_forget_jobs_status')),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_forget_jobs_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_forget_jobs')),
    sa.UniqueConstraint('tenant_id', 'idempotency_key', name=op.f('uq_forget_jobs_tenant_id_idempotency_key'))
    )
    op.create_index('ix_forget_jobs_status_created_at', 'forget_jobs', ['status', 'created_at'], unique=False)
    op.create_index(op.f('ix_forget_jobs_tenant_id'), 'forget_jobs', ['tenant_id'], unique=False)
    op.create_table('memory_records',
    sa.Column('tenant_id', sa.String(length=40), nullable=False),
    sa.Column('namespace', sa.String(length=200), nullable=False),
    sa.Column('key', sa.String(length=200), nullable=False),
    sa.Column('version', sa.BigInteger(), nullable=False),
    sa.Column('value', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('forgotten', sa.Boolean(), nullable=False),
    sa.Column('source', sa.String(length=100), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('NOT forgotten OR value IS NULL', name=op.f('ck_memory_records_tombstone_has_no_value')),
    sa.CheckConstraint('version > 0', name=op.f('ck_memory_records_version_positive')),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_memory_records_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('tenant_id', 'namespace', 'key', name=op.f('pk_memory_records'))
    )
    op.create_table('sessions',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('tenant_id', sa.String(length=40), nullable=False),
    sa.Column('epoch', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('system_prompt', sa.Text(), nullable=True),
    sa.Column('memory_namespace', sa.String(length=200), nullable=True),
    sa.Column('context_policy', sa.String(length=20), nullable=False),
    sa.Column('checkpoint_policy', sa.String(length=30), nullable=False),
    sa.Column('retrieval', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('tools', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('sampling', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('turns', sa.Integer(), nullable=False),
    sa.Column('token_count', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("checkpoint_policy IN ('every_turn', 'before_injections', 'session_start')", name=op.f('ck_sessions_checkpoint_policy')),
    sa.CheckConstraint("context_policy IN ('full', 'retrieval')", name=op.f('ck_sessions_context_policy')),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_sessions_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_sessions')),
    sa.UniqueConstraint('tenant_id', 'id', name=op.f('uq_sessions_tenant_id_id'))
    )
    op.create_index(op.f('ix_sessions_tenant_id'), 'sessions', ['tenant_id'], unique=False)
    op.create_table('artifacts',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('tenant_id', sa.String(length=40), nullable=False),
    sa.Column('session_id', sa.String(length=40), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=20), nullable=False),
    sa.Column('turn', sa.Integer(), nullable=False),
    sa.Column('content', sa.Text(), nullable=False),
    sa.Column('token_start', sa.Integer(), nullable=False),
    sa.Column('token_end', sa.Integer(), nullable=False),
    sa.Column('token_ids', postgresql.ARRAY(sa.Integer()), nullable=False),
    sa.Column('source_ids', postgresql.ARRAY(sa.String(length=40)), nullable=False),
    sa.Column('committed', sa.Boolean(), nullable=False),
    sa.Column('meta', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('embedding', pgvector.sqlalchemy.vector.VECTOR(dim=384), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('token_start >= 0 AND token_end >= token_start', name=op.f('ck_artifacts_token_span')),
    sa.ForeignKeyConstraint(['session_id'], ['sessions.id'], name=op.f('fk_artifacts_session_id_sessions'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_artifacts_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_artifacts')),
    sa.UniqueConstraint('session_id', 'position', name=op.f('uq_artifacts_session_id_position'))
    )
    op.create_index('ix_artifacts_session_id_turn', 'artifacts', ['session_id', 'turn'], unique=False)
    op.create_table('checkpoints',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('session_id', sa.String(length=40), nullable=False),
    sa.Column('turn', sa.Integer(), nullable=False),
    sa.Column('token_offset', sa.Integer(), nullable=False),
    sa.Column('env_snapshot_id', sa.String(length=40), nullable=True),
    sa.Column('manifest_sha256', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['session_id'], ['sessions.id'], name=op.f('fk_checkpoints_session_id_sessions'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_checkpoints')),
    sa.UniqueConstraint('session_id', 'turn', name=op.f('uq_checkpoints_session_id_turn'))
    )
    op.create_table('memory_versions',
    sa.Column('tenant_id', sa.String(length=40), nullable=False),
    sa.Column('namespace', sa.String(length=200), nullable=False),
    sa.Column('key', sa.String(length=200), nullable=False),
    sa.Column('version', sa.BigInteger(), nullable=False),
    sa.Column('op', sa.String(length=10), nullable=False),
    sa.Column('value', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('source', sa.String(length=100), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("op IN ('write', 'forget')", name=op.f('ck_memory_versions_op')),
    sa.ForeignKeyConstraint(['tenant_id', 'namespace', 'key'], ['memory_records.tenant_id', 'memory_records.namespace', 'memory_records.key'], name=op.f('fk_memory_versions_tenant_id_namespace_key_memory_records'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('tenant_id', 'namespace', 'key', 'version', name=op.f('pk_memory_versions'))
    )
    op.create_table('webhook_deliveries',
    sa.Column('tenant_id', sa.String(length=40), nullable=False),
    sa.Column('webhook_id', sa.String(length=200), nullable=False),
    sa.Column('forget_id', sa.String(length=40), nullable=True),
    sa.Column('received_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['forget_id'], ['forget_jobs.id'], name=op.f('fk_webhook_deliveries_forget_id_forget_jobs'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_webhook_deliveries_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('tenant_id', 'webhook_id', name=op.f('pk_webhook_deliveries'))
    )
    op.create_table('provenance_edges',
    sa.Column('session_id', sa.String(length=40), nullable=False),
    sa.Column('parent_id', sa.String(length=40), nullable=False),
    sa.Column('child_id', sa.String(length=40), nullable=False),
    sa.Column('turn', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['child_id'], ['artifacts.id'], name=op.f('fk_provenance_edges_child_id_artifacts'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['parent_id'], ['artifacts.id'], name=op.f('fk_provenance_edges_parent_id_artifacts'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['session_id'], ['sessions.id'], name=op.f('fk_provenance_edges_session_id_sessions'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('parent_id', 'child_id', name=op.f('pk_provenance_edges'))
    )
    op.create_index('ix_provenance_edges_session_id_child_id', 'provenance_edges', ['session_id', 'child_id'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_provenance_edges_session_id_child_id', table_name='provenance_edges')
    op.drop_table('provenance_edges')
    op.drop_table('webhook_deliveries')
    op.drop_table('memory_versions')
    op.drop_table('checkpoints')
    op.drop_index('ix_artifacts_session_id_turn', table_name='artifacts')
    op.drop_table('artifacts')
    op.drop_index(op.f('ix_sessions_tenant_id'), table_name='sessions')
    op.drop_table('sessions')
    op.drop_table('memory_records')
    op.drop_index(op.f('ix_forget_jobs_tenant_id'), table_name='forget_jobs')
    op.drop_index('ix_forget_jobs_status_created_at', table_name='forget_jobs')
    op.drop_table('forget_jobs')
    op.drop_index(op.f('ix_api_keys_tenant_id'), table_name='api_keys')
    op.drop_table('api_keys')
    op.drop_table('tenants')
