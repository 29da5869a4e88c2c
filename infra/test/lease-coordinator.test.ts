import assert from 'node:assert/strict';
import * as path from 'node:path';
import { describe, test } from 'node:test';
import { CfnElement, Duration, Stack } from 'aws-cdk-lib';
import { Match, Template } from 'aws-cdk-lib/assertions';
import * as events from 'aws-cdk-lib/aws-events';
import * as iam from 'aws-cdk-lib/aws-iam';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as sns from 'aws-cdk-lib/aws-sns';
import { IConstruct } from 'constructs';
import { LeaseCoordinator, LeaseCoordinatorProps } from '../lib/lease-coordinator';
import { placeholderCodeDirs, testApp } from './fixtures';

function synth(props: LeaseCoordinatorProps = {}) {
  const stack = new Stack(testApp(), 'Test');
  const coordinator = new LeaseCoordinator(stack, 'Coordinator', { ...placeholderCodeDirs(), ...props });
  return { stack, coordinator, template: Template.fromStack(stack) };
}

const logicalId = (stack: Stack, construct: IConstruct): string =>
  stack.getLogicalId(construct.node.defaultChild as CfnElement);

const arnOf = (stack: Stack, construct: IConstruct) => ({ 'Fn::GetAtt': [logicalId(stack, construct), 'Arn'] });

/** A function may write to its own log group and nowhere else. */
const logsStatement = (stack: Stack, fn: lambda.Function) => ({
  Action: ['logs:CreateLogStream', 'logs:PutLogEvents'],
  Effect: 'Allow',
  Resource: arnOf(stack, fn.logGroup),
});

/** Every statement of the inline policies attached to the role, resolved. */
function statementsOf(template: Template, stack: Stack, role: iam.IRole) {
  const roleRef = { Ref: logicalId(stack, role) };
  return Object.values(template.findResources('AWS::IAM::Policy'))
    .filter((policy) => policy.Properties.Roles.some((r: unknown) => JSON.stringify(r) === JSON.stringify(roleRef)))
    .flatMap((policy) => policy.Properties.PolicyDocument.Statement);
}

describe('LeaseCoordinator', () => {
  test('the lease table is keyed by connection_id with TTL, PITR, SSE and deletion protection', () => {
    const { template } = synth();
    template.resourceCountIs('AWS::DynamoDB::Table', 1);
    template.hasResourceProperties('AWS::DynamoDB::Table', {
      BillingMode: 'PAY_PER_REQUEST',
      KeySchema: [{ AttributeName: 'connection_id', KeyType: 'HASH' }],
      AttributeDefinitions: Match.arrayWith([
        { AttributeName: 'connection_id', AttributeType: 'S' },
        { AttributeName: 'desired_state', AttributeType: 'S' },
        { AttributeName: 'lease_expires_at_ms', AttributeType: 'N' },
      ]),
      TimeToLiveSpecification: { AttributeName: 'ttl', Enabled: true },
      PointInTimeRecoverySpecification: { PointInTimeRecoveryEnabled: true },
      SSESpecification: { SSEEnabled: true },
      DeletionProtectionEnabled: true,
    });
  });

  test('deletion protection can be turned off', () => {
    synth({ deletionProtection: false }).template.hasResourceProperties('AWS::DynamoDB::Table', {
      DeletionProtectionEnabled: false,
    });
  });

  test('the orphan index is keyed by desired_state and lease_expires_at_ms and projects everything; the owner index keeps keys only', () => {
    const { template } = synth();
    template.hasResourceProperties('AWS::DynamoDB::Table', {
      GlobalSecondaryIndexes: [
        {
          IndexName: 'desired_state-lease_expires_at_ms-index',
          KeySchema: [
            { AttributeName: 'desired_state', KeyType: 'HASH' },
            { AttributeName: 'lease_expires_at_ms', KeyType: 'RANGE' },
          ],
          Projection: { ProjectionType: 'ALL' },
        },
        {
          IndexName: 'lease_owner-index',
          KeySchema: [{ AttributeName: 'lease_owner', KeyType: 'HASH' }],
          Projection: { ProjectionType: 'KEYS_ONLY' },
        },
      ],
    });
  });

  test('the hint and command queues each redrive to an encrypted dead-letter queue of their own after 5 receives', () => {
    const { stack, coordinator, template } = synth();
    const queues = template.findResources('AWS::SQS::Queue');
    assert.equal(Object.keys(queues).length, 4);
    const pairs = [
      [coordinator.queue, coordinator.deadLetterQueue],
      [coordinator.commandQueue, coordinator.commandDeadLetterQueue],
    ];
    for (const [queue, deadLetterQueue] of pairs) {
      const props = queues[logicalId(stack, queue)].Properties;
      assert.equal(props.SqsManagedSseEnabled, true);
      assert.deepEqual(props.RedrivePolicy, { deadLetterTargetArn: arnOf(stack, deadLetterQueue), maxReceiveCount: 5 });
      const deadLetterProps = queues[logicalId(stack, deadLetterQueue)].Properties;
      assert.equal(deadLetterProps.SqsManagedSseEnabled, true);
      assert.equal(deadLetterProps.RedrivePolicy, undefined);
      assert.equal(deadLetterProps.MessageRetentionPeriod, 14 * 24 * 3600);
    }
  });

  test('every queue refuses requests without TLS', () => {
    const { template } = synth();
    const policies = Object.values(template.findResources('AWS::SQS::QueuePolicy'));
    const covered = policies
      .filter((policy) =>
        policy.Properties.PolicyDocument.Statement.some(
          (statement: { Effect: string; Condition?: unknown }) =>
            statement.Effect === 'Deny' &&
            JSON.stringify(statement.Condition) === JSON.stringify({ Bool: { 'aws:SecureTransport': 'false' } }),
        ),
      )
      .flatMap((policy) => policy.Properties.Queues.map((queue: { Ref: string }) => queue.Ref));
    assert.equal(covered.length, 4);
    assert.deepEqual(covered.sort(), Object.keys(template.findResources('AWS::SQS::Queue')).sort());
  });

  test('the router takes commands from the command queue in batches of 10, reporting failed records one by one', () => {
    const { stack, coordinator, template } = synth();
    const mappings = Object.values(template.findResources('AWS::Lambda::EventSourceMapping'));
    assert.equal(mappings.length, 1);
    assert.deepEqual(mappings[0].Properties, {
      EventSourceArn: arnOf(stack, coordinator.commandQueue),
      FunctionName: { Ref: logicalId(stack, coordinator.router) },
      BatchSize: 10,
      FunctionResponseTypes: ['ReportBatchItemFailures'],
    });
  });

  test('the command queue stays invisible for at least 6x the router timeout plus its batching window', () => {
    const { stack, coordinator, template } = synth();
    const [mapping] = Object.values(template.findResources('AWS::Lambda::EventSourceMapping'));
    const router = template.findResources('AWS::Lambda::Function')[logicalId(stack, coordinator.router)];
    const queue = template.findResources('AWS::SQS::Queue')[logicalId(stack, coordinator.commandQueue)];
    const timeout: number = router.Properties.Timeout;
    const window: number = mapping.Properties.MaximumBatchingWindowInSeconds ?? 0;
    assert.equal(timeout, 10);
    assert.ok(
      queue.Properties.VisibilityTimeout >= 6 * timeout + window,
      `visibility ${queue.Properties.VisibilityTimeout} s < 6 x ${timeout} s + ${window} s`,
    );
  });

  test('every route of the API requires IAM auth, and only the three router routes exist', () => {
    const { template } = synth();
    const routes = Object.values(template.findResources('AWS::ApiGatewayV2::Route'));
    assert.deepEqual(
      routes.map((route) => route.Properties.RouteKey).sort(),
      ['GET /connections/{id}', 'POST /connections/{id}/start', 'POST /connections/{id}/stop'],
    );
    for (const route of routes) {
      assert.equal(route.Properties.AuthorizationType, 'AWS_IAM', route.Properties.RouteKey);
    }
    template.hasResourceProperties('AWS::ApiGatewayV2::Stage', {
      StageName: '$default',
      AccessLogSettings: Match.objectLike({ Format: Match.stringLikeRegexp('context.requestId') }),
    });
  });

  test('both functions are arm64 provided.al2023 bootstraps logging JSON with the LEASELOCK_* contract', () => {
    const { stack, coordinator, template } = synth({
      indexName: 'orphans',
      keyPrefix: 'prod/',
      leaseDuration: Duration.seconds(30),
      metricsNamespace: 'fleet',
    });
    const functions = template.findResources('AWS::Lambda::Function');
    assert.equal(Object.keys(functions).length, 2);
    for (const fn of [coordinator.router, coordinator.reconciler]) {
      const props = functions[logicalId(stack, fn)].Properties;
      assert.equal(props.Runtime, 'provided.al2023');
      assert.deepEqual(props.Architectures, ['arm64']);
      assert.equal(props.Handler, 'bootstrap');
      assert.equal(props.LoggingConfig.LogFormat, 'JSON');
      assert.deepEqual(props.Environment.Variables, {
        LEASELOCK_TABLE: { Ref: logicalId(stack, coordinator.table) },
        LEASELOCK_QUEUE_URL: { Ref: logicalId(stack, coordinator.queue) },
        LEASELOCK_INDEX_NAME: 'orphans',
        LEASELOCK_OWNER_INDEX_NAME: 'lease_owner-index',
        LEASELOCK_KEY_PREFIX: 'prod/',
        LEASELOCK_LEASE_MS: '30000',
        LEASELOCK_RENEW_MS: '5000',
        LEASELOCK_CLOCK_SKEW_MS: '1000',
        LEASELOCK_METRICS_NAMESPACE: 'fleet',
        // The router's store operations answer well within its 10 s timeout.
        ...(fn === coordinator.router ? { LEASELOCK_OPERATION_BUDGET_MS: '4000' } : {}),
        // The reconciler's sweep for stranded work (session mode): every 10 minutes, 1 minute of grace.
        ...(fn === coordinator.reconciler
          ? { LEASELOCK_SWEEP_INTERVAL_MINUTES: '10', LEASELOCK_SWEEP_GRACE_MS: '60000' }
          : {}),
      });
    }
  });

  test('orphan shards reach both functions and the workers when sharded, and a bad count fails synthesis', () => {
    const { stack, coordinator, template } = synth({ orphanShards: 64 });
    for (const fn of [coordinator.router, coordinator.reconciler]) {
      const variables = template.findResources('AWS::Lambda::Function')[logicalId(stack, fn)].Properties.Environment.Variables;
      assert.equal(variables.LEASELOCK_ORPHAN_SHARDS, '64');
    }
    assert.equal(coordinator.environment.LEASELOCK_ORPHAN_SHARDS, '64');
    assert.equal(synth().coordinator.environment.LEASELOCK_ORPHAN_SHARDS, undefined);
    for (const bad of [0, 257, 1.5, Number.NaN]) {
      assert.throws(() => synth({ orphanShards: bad }), /orphanShards must be an integer from 1 to 256/);
    }
  });

  test('the sweep for stranded work is set by props (0 turns it off)', () => {
    const { stack, coordinator, template } = synth({ sweepIntervalMinutes: 0, sweepGrace: Duration.minutes(5) });
    const variables = template.findResources('AWS::Lambda::Function')[logicalId(stack, coordinator.reconciler)]
      .Properties.Environment.Variables;
    assert.equal(variables.LEASELOCK_SWEEP_INTERVAL_MINUTES, '0');
    assert.equal(variables.LEASELOCK_SWEEP_GRACE_MS, '300000');
  });

  test('the router may only get and update lease items, describe the table, send hints and consume the command queue', () => {
    const { stack, coordinator, template } = synth();
    assert.deepEqual(statementsOf(template, stack, coordinator.router.role!), [
      logsStatement(stack, coordinator.router),
      {
        Action: ['dynamodb:GetItem', 'dynamodb:UpdateItem', 'dynamodb:DescribeTable'],
        Effect: 'Allow',
        Resource: arnOf(stack, coordinator.table),
      },
      { Action: 'sqs:SendMessage', Effect: 'Allow', Resource: arnOf(stack, coordinator.queue) },
      {
        Action: ['sqs:ReceiveMessage', 'sqs:DeleteMessage', 'sqs:GetQueueAttributes', 'sqs:ChangeMessageVisibility'],
        Effect: 'Allow',
        Resource: arnOf(stack, coordinator.commandQueue),
      },
    ]);
  });

  test('the reconciler may only query the two indexes, describe, scan and batch-read the table and send hints', () => {
    const { stack, coordinator, template } = synth();
    const index = (name: string) => ({ 'Fn::Join': ['', [arnOf(stack, coordinator.table), `/index/${name}`]] });
    assert.deepEqual(statementsOf(template, stack, coordinator.reconciler.role!), [
      logsStatement(stack, coordinator.reconciler),
      { Action: 'dynamodb:Query', Effect: 'Allow', Resource: index('desired_state-lease_expires_at_ms-index') },
      { Action: 'dynamodb:DescribeTable', Effect: 'Allow', Resource: arnOf(stack, coordinator.table) },
      // Session mode: a dead session's work (the owner index), the sweep for stranded work.
      { Action: 'dynamodb:Query', Effect: 'Allow', Resource: index('lease_owner-index') },
      { Action: ['dynamodb:Scan', 'dynamodb:BatchGetItem'], Effect: 'Allow', Resource: arnOf(stack, coordinator.table) },
      { Action: 'sqs:SendMessage', Effect: 'Allow', Resource: arnOf(stack, coordinator.queue) },
    ]);
  });

  test('the functions carry no managed policies', () => {
    const { template } = synth();
    const roles = Object.values(template.findResources('AWS::IAM::Role'));
    assert.equal(roles.length, 2);
    for (const role of roles) {
      assert.equal(role.Properties.ManagedPolicyArns, undefined);
    }
  });

  test('the reconciler runs every minute, or on the given schedule', () => {
    const { stack, coordinator, template } = synth();
    template.resourceCountIs('AWS::Events::Rule', 1);
    template.hasResourceProperties('AWS::Events::Rule', {
      ScheduleExpression: 'rate(1 minute)',
      Targets: [Match.objectLike({ Arn: arnOf(stack, coordinator.reconciler) })],
    });
    synth({ reconcileSchedule: events.Schedule.rate(Duration.minutes(5)) }).template.hasResourceProperties(
      'AWS::Events::Rule',
      { ScheduleExpression: 'rate(5 minutes)' },
    );
  });

  test('an alarm fires on any message in either dead-letter queue', () => {
    const { stack, coordinator, template } = synth();
    for (const queue of [coordinator.deadLetterQueue, coordinator.commandDeadLetterQueue]) {
      template.hasResourceProperties('AWS::CloudWatch::Alarm', {
        Namespace: 'AWS/SQS',
        MetricName: 'ApproximateNumberOfMessagesVisible',
        Dimensions: [{ Name: 'QueueName', Value: { 'Fn::GetAtt': [logicalId(stack, queue), 'QueueName'] } }],
        Statistic: 'Maximum',
        Period: 60,
        ComparisonOperator: 'GreaterThanThreshold',
        Threshold: 0,
        EvaluationPeriods: 1,
      });
    }
  });

  test('an alarm fires when orphans persist for N periods (default 5)', () => {
    const orphansAlarm = (periods: number) => ({
      Namespace: 'leaselock',
      MetricName: 'Orphans',
      Dimensions: [{ Name: 'Service', Value: 'reconciler' }],
      ComparisonOperator: 'GreaterThanThreshold',
      Threshold: 0,
      Period: 60,
      EvaluationPeriods: periods,
    });
    synth().template.hasResourceProperties('AWS::CloudWatch::Alarm', orphansAlarm(5));
    synth({ orphanAlarmPeriods: 3 }).template.hasResourceProperties('AWS::CloudWatch::Alarm', orphansAlarm(3));
  });

  test('an alarm fires when every reconciler run is cut short for 3 periods, telling what to do', () => {
    synth({ orphanAlarmPeriods: 7 }).template.hasResourceProperties('AWS::CloudWatch::Alarm', {
      AlarmDescription: Match.stringLikeRegexp("Raise the reconciler's Timeout or memory, or look for DynamoDB/SQS throttling"),
      Namespace: 'leaselock',
      MetricName: 'Incomplete',
      Dimensions: [{ Name: 'Service', Value: 'reconciler' }],
      Statistic: 'Minimum',
      Period: 60,
      EvaluationPeriods: 3,
      Threshold: 0,
      ComparisonOperator: 'GreaterThanThreshold',
      TreatMissingData: 'notBreaching',
    });
  });

  test("an alarm fires when a worker's clock is off the store's by more than half the skew, either way", () => {
    const clockAlarm = (skewMs: number) => ({
      AlarmDescription: Match.stringLikeRegexp("more than half the clock skew .* fix the host's time synchronisation"),
      // Twice the largest offset either way, against the skew: half the skew.
      Metrics: [
        Match.objectLike({ Id: 'expr_1', Expression: '2 * MAX([ABS(ahead), ABS(behind)])', ReturnData: true }),
        ...[
          ['ahead', 'Maximum'],
          ['behind', 'Minimum'],
        ].map(([id, stat]) => ({
          Id: id,
          MetricStat: {
            Metric: {
              Namespace: 'leaselock',
              MetricName: 'ClockOffsetMs',
              Dimensions: [{ Name: 'Service', Value: 'worker' }],
            },
            Period: 60,
            Stat: stat,
          },
          ReturnData: false,
        })),
      ],
      Threshold: skewMs,
      ComparisonOperator: 'GreaterThanThreshold',
      EvaluationPeriods: 3,
      TreatMissingData: 'notBreaching',
    });
    synth().template.hasResourceProperties('AWS::CloudWatch::Alarm', clockAlarm(1_000));
    synth({ clockSkew: Duration.millis(400) }).template.hasResourceProperties('AWS::CloudWatch::Alarm', clockAlarm(400));
  });

  test("alarms fire on the workers' lost leases, claim errors and slow renewals", () => {
    const { template } = synth();
    for (const metric of ['LeasesLost', 'AcquireErrors']) {
      template.hasResourceProperties('AWS::CloudWatch::Alarm', {
        Namespace: 'leaselock',
        MetricName: metric,
        Dimensions: [{ Name: 'Service', Value: 'worker' }],
        Statistic: 'Sum',
        Period: 60,
        EvaluationPeriods: 3,
        Threshold: 0,
        ComparisonOperator: 'GreaterThanThreshold',
        TreatMissingData: 'notBreaching',
      });
    }
    // p99 above a fifth of the lease: five times the p99 against the lease.
    const latencyAlarm = (leaseMs: number) => ({
      Metrics: [
        Match.objectLike({ Id: 'expr_1', Expression: '5 * latency', ReturnData: true }),
        {
          Id: 'latency',
          MetricStat: {
            Metric: { Namespace: 'leaselock', MetricName: 'RenewLatency', Dimensions: [{ Name: 'Service', Value: 'worker' }] },
            Period: 60,
            Stat: 'p99',
          },
          ReturnData: false,
        },
      ],
      Threshold: leaseMs,
      ComparisonOperator: 'GreaterThanThreshold',
      EvaluationPeriods: 3,
    });
    template.hasResourceProperties('AWS::CloudWatch::Alarm', latencyAlarm(20_000));
    synth({ leaseDuration: Duration.seconds(30) }).template.hasResourceProperties('AWS::CloudWatch::Alarm', latencyAlarm(30_000));
  });

  test('every alarm notifies the alarm topic when one is given', () => {
    const stack = new Stack(testApp(), 'Test');
    const topic = new sns.Topic(stack, 'Topic');
    new LeaseCoordinator(stack, 'Coordinator', { ...placeholderCodeDirs(), alarmTopic: topic });
    const found = Template.fromStack(stack).findResources('AWS::CloudWatch::Alarm');
    assert.deepEqual(Object.keys(found).map((id) => id.replace(/^Coordinator|[0-9A-F]{8}$/g, '')).sort(), [
      'AcquireErrorsAlarm',
      'ClockOffsetAlarm',
      'CommandDeadLetterQueueAlarm',
      'DeadLetterQueueAlarm',
      'LeasesLostAlarm',
      'OrphansAlarm',
      'ReconcilerIncompleteAlarm',
      'RenewLatencyAlarm',
    ]);
    const alarms = Object.values(found);
    for (const alarm of alarms) {
      assert.deepEqual(alarm.Properties.AlarmActions, [{ Ref: logicalId(stack, topic) }]);
    }
  });

  test('the dashboard graphs every reconciler and worker metric', () => {
    const { template } = synth();
    const [dashboard] = Object.values(template.findResources('AWS::CloudWatch::Dashboard'));
    const body = JSON.stringify(dashboard.Properties.DashboardBody);
    const metrics = {
      reconciler: ['Orphans', 'Started', 'Stopped', 'Owned', 'HintsSent', 'HintsFailed', 'HintsDeferred', 'Incomplete'],
      worker: ['ActiveConnections', 'Acquired', 'AcquireConflicts', 'LeasesLost', 'RenewLatency'],
    };
    for (const [service, names] of Object.entries(metrics)) {
      for (const name of names) {
        assert.ok(body.includes(`[\\"leaselock\\",\\"${name}\\",\\"Service\\",\\"${service}\\"`), `${service} ${name}`);
      }
    }
  });

  test('the dashboard sums deferred hints beside sent and failed ones, and shows whether runs were cut short', () => {
    const { template } = synth();
    const [dashboard] = Object.values(template.findResources('AWS::CloudWatch::Dashboard'));
    const [separator, parts] = dashboard.Properties.DashboardBody['Fn::Join'];
    const body = JSON.parse(parts.map((part: unknown) => (typeof part === 'string' ? part : 'region')).join(separator));
    const graphed = (title: string) => {
      const widget = body.widgets.find((w: { properties: { title: string } }) => w.properties.title === title);
      assert.ok(widget, title);
      return widget.properties.metrics.map((metric: unknown[]) => `${metric[1]} ${(metric[4] as { stat: string }).stat}`);
    };
    assert.deepEqual(graphed('Reconciler: hints'), ['HintsSent Sum', 'HintsFailed Sum', 'HintsDeferred Sum']);
    assert.deepEqual(graphed('Reconciler: runs cut short (1 = incomplete)'), ['Incomplete Maximum']);
  });

  test('the outputs name the table, index, queues and API', () => {
    const outputs = Object.keys(synth().template.findOutputs('*')).map((id) => id.replace(/^Coordinator|[0-9A-F]{8}$/g, ''));
    assert.deepEqual(outputs.sort(), [
      'ApiUrl',
      'CommandDeadLetterQueueUrl',
      'CommandQueueUrl',
      'DeadLetterQueueUrl',
      'IndexName',
      'OwnerIndexName',
      'QueueUrl',
      'TableName',
    ]);
  });

  test('a missing bootstrap fails synthesis with the build command to run', () => {
    const missing = path.join(placeholderCodeDirs().routerCodeDir, 'absent');
    assert.throws(() => synth({ routerCodeDir: missing }), /cargo lambda build --release --arm64/);
  });
});
