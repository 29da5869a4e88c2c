import * as fs from 'node:fs';
import * as path from 'node:path';
import { CfnOutput, Duration, RemovalPolicy, Stack } from 'aws-cdk-lib';
import * as apigw from 'aws-cdk-lib/aws-apigateway';
import * as apigwv2 from 'aws-cdk-lib/aws-apigatewayv2';
import { HttpIamAuthorizer } from 'aws-cdk-lib/aws-apigatewayv2-authorizers';
import { HttpLambdaIntegration } from 'aws-cdk-lib/aws-apigatewayv2-integrations';
import * as cloudwatch from 'aws-cdk-lib/aws-cloudwatch';
import * as cloudwatchActions from 'aws-cdk-lib/aws-cloudwatch-actions';
import * as dynamodb from 'aws-cdk-lib/aws-dynamodb';
import * as events from 'aws-cdk-lib/aws-events';
import * as targets from 'aws-cdk-lib/aws-events-targets';
import * as iam from 'aws-cdk-lib/aws-iam';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as logs from 'aws-cdk-lib/aws-logs';
import * as sns from 'aws-cdk-lib/aws-sns';
import * as sqs from 'aws-cdk-lib/aws-sqs';
import { Construct } from 'constructs';
import { DEFAULT_METRICS_NAMESPACE, leaseMetric } from './metrics';

/** Where `cargo lambda build --release --arm64` (run at the repository root) puts each bootstrap. */
const CARGO_LAMBDA_OUTPUT = path.resolve(__dirname, '..', '..', 'target', 'lambda');

const LOG_RETENTION = logs.RetentionDays.ONE_MONTH;

const ROUTER_TIMEOUT = Duration.seconds(10);
/**
 * The router's budget per store operation: well below its Timeout, so a slow or missing store
 * answers with the store's own error (503 / 500) instead of a Lambda timeout, with time left for
 * the hint.
 */
const ROUTER_OPERATION_BUDGET = Duration.seconds(4);

/** Consecutive one-minute periods with a worker's clock off the store's before the alarm fires. */
const CLOCK_ALARM_PERIODS = 3;

/** Consecutive one-minute periods whose reconciler runs were all cut short before the alarm fires. */
const INCOMPLETE_ALARM_PERIODS = 3;

/** Consecutive one-minute periods of lost leases, claim errors or slow renewals before a worker alarm fires. */
const WORKER_ALARM_PERIODS = 3;

/** Commands the router takes from the command queue per invocation. */
const COMMAND_BATCH_SIZE = 10;

export interface LeaseCoordinatorProps {
  /** Name of the sparse orphan index. @default 'desired_state-lease_expires_at_ms-index' */
  readonly indexName?: string;
  /** Name of the sparse keys-only owner index. @default 'lease_owner-index' */
  readonly ownerIndexName?: string;
  /** Prefix of every key leaselock writes. @default '' */
  readonly keyPrefix?: string;
  /** @default Duration.seconds(20) */
  readonly leaseDuration?: Duration;
  /** @default Duration.seconds(5) */
  readonly renewInterval?: Duration;
  /** Largest clock difference between two workers that leases stay safe under. @default Duration.seconds(1) */
  readonly clockSkew?: Duration;
  /**
   * `per-item` renews every held item (the AWS reference design); `session` renews one session
   * item per worker (session items live in the orphan index under their own partition value).
   * @default 'per-item'
   */
  readonly leaseMode?: 'per-item' | 'session';
  /**
   * Partition values the orphan index's STARTED entries are spread over (1 to 256; 1: unsharded).
   * Every worker must use the same number: it is part of `environment`.
   * @default 1
   */
  readonly orphanShards?: number;
  /** @default 'leaselock' */
  readonly metricsNamespace?: string;
  /** @default Schedule.rate(Duration.minutes(1)) */
  readonly reconcileSchedule?: events.Schedule;
  /**
   * Session mode: minutes between the reconciler's sweeps for stranded work (0: never; a multiple
   * of the schedule's period). A sweep is a consistent Scan of the whole table, about one read
   * unit per 4 KB of items.
   * @default 10
   */
  readonly sweepIntervalMinutes?: number;
  /**
   * Session mode: how long a session must have been dead, beyond the clock skew, before the sweep
   * counts its work as stranded and hints it.
   * @default Duration.minutes(1)
   */
  readonly sweepGrace?: Duration;
  /** Consecutive one-minute periods with orphans before the orphan alarm fires. @default 5 */
  readonly orphanAlarmPeriods?: number;
  /** @default true */
  readonly deletionProtection?: boolean;
  /** Notified by every alarm. @default - no notification */
  readonly alarmTopic?: sns.ITopic;
  /** Directory holding the router's `bootstrap`. @default '../target/lambda/router' */
  readonly routerCodeDir?: string;
  /** Directory holding the reconciler's `bootstrap`. @default '../target/lambda/reconciler' */
  readonly reconcilerCodeDir?: string;
}

/**
 * The lease table with its sparse orphan index, the START hint queue and its dead-letter queue,
 * the router behind an IAM-authorised HTTP API and fed by a command queue (with its own dead-letter
 * queue), the scheduled reconciler, alarms and a dashboard.
 */
export class LeaseCoordinator extends Construct {
  readonly table: dynamodb.Table;
  readonly indexName: string;
  /** ARN of the orphan index: the only resource a reconciling query needs. */
  readonly indexArn: string;
  readonly ownerIndexName: string;
  /** ARN of the owner index (an owner's leases without a scan). */
  readonly ownerIndexArn: string;
  readonly queue: sqs.Queue;
  readonly deadLetterQueue: sqs.Queue;
  /** START/STOP commands for the router, one JSON command per message. */
  readonly commandQueue: sqs.Queue;
  readonly commandDeadLetterQueue: sqs.Queue;
  readonly api: apigwv2.HttpApi;
  readonly router: lambda.Function;
  readonly reconciler: lambda.Function;
  readonly metricsNamespace: string;
  /** The LEASELOCK_* variables every leaselock process (Lambda or worker) reads. */
  readonly environment: Readonly<Record<string, string>>;

  constructor(scope: Construct, id: string, props: LeaseCoordinatorProps = {}) {
    super(scope, id);
    this.indexName = props.indexName ?? 'desired_state-lease_expires_at_ms-index';
    this.ownerIndexName = props.ownerIndexName ?? 'lease_owner-index';
    this.metricsNamespace = props.metricsNamespace ?? DEFAULT_METRICS_NAMESPACE;
    const deletionProtection = props.deletionProtection ?? true;
    const orphanShards = props.orphanShards ?? 1;
    if (!Number.isInteger(orphanShards) || orphanShards < 1 || orphanShards > 256) {
      throw new Error(`orphanShards must be an integer from 1 to 256, not ${orphanShards}`);
    }

    this.table = new dynamodb.Table(this, 'Table', {
      partitionKey: { name: 'connection_id', type: dynamodb.AttributeType.STRING },
      billingMode: dynamodb.BillingMode.PAY_PER_REQUEST,
      timeToLiveAttribute: 'ttl',
      pointInTimeRecoverySpecification: { pointInTimeRecoveryEnabled: true },
      encryption: dynamodb.TableEncryption.AWS_MANAGED,
      deletionProtection,
      removalPolicy: RemovalPolicy.DESTROY,
    });
    // Sparse: only fleet work carries desired_state, so leader keys never show up as orphans.
    this.table.addGlobalSecondaryIndex({
      indexName: this.indexName,
      partitionKey: { name: 'desired_state', type: dynamodb.AttributeType.STRING },
      sortKey: { name: 'lease_expires_at_ms', type: dynamodb.AttributeType.NUMBER },
      projectionType: dynamodb.ProjectionType.ALL,
    });
    this.indexArn = `${this.table.tableArn}/index/${this.indexName}`;
    // Keys only, on the owner alone: a renewal (same owner) writes nothing to it.
    this.table.addGlobalSecondaryIndex({
      indexName: this.ownerIndexName,
      partitionKey: { name: 'lease_owner', type: dynamodb.AttributeType.STRING },
      projectionType: dynamodb.ProjectionType.KEYS_ONLY,
    });
    this.ownerIndexArn = `${this.table.tableArn}/index/${this.ownerIndexName}`;

    [this.queue, this.deadLetterQueue] = this.queueWithDeadLetters('HintQueue', 'DeadLetterQueue');
    [this.commandQueue, this.commandDeadLetterQueue] = this.queueWithDeadLetters('CommandQueue', 'CommandDeadLetterQueue', {
      // At least 6x the router's timeout, as AWS advises for a Lambda event source: a batch whose
      // invocation is being retried (throttling) must not become visible again meanwhile.
      visibilityTimeout: Duration.seconds(6 * ROUTER_TIMEOUT.toSeconds()),
    });

    this.environment = {
      LEASELOCK_TABLE: this.table.tableName,
      LEASELOCK_QUEUE_URL: this.queue.queueUrl,
      LEASELOCK_INDEX_NAME: this.indexName,
      LEASELOCK_OWNER_INDEX_NAME: this.ownerIndexName,
      LEASELOCK_KEY_PREFIX: props.keyPrefix ?? '',
      LEASELOCK_LEASE_MS: String((props.leaseDuration ?? Duration.seconds(20)).toMilliseconds()),
      LEASELOCK_RENEW_MS: String((props.renewInterval ?? Duration.seconds(5)).toMilliseconds()),
      LEASELOCK_CLOCK_SKEW_MS: String((props.clockSkew ?? Duration.seconds(1)).toMilliseconds()),
      // Only in session mode: per-item (the default) is what every process does without it.
      ...(props.leaseMode === 'session' ? { LEASELOCK_MODE: 'session' } : {}),
      // Only when sharded: 1 is what every process does without it.
      ...(orphanShards > 1 ? { LEASELOCK_ORPHAN_SHARDS: String(orphanShards) } : {}),
      LEASELOCK_METRICS_NAMESPACE: this.metricsNamespace,
    };

    this.router = this.leaseFunction('Router', {
      codeDir: props.routerCodeDir ?? path.join(CARGO_LAMBDA_OUTPUT, 'router'),
      description: 'Sets desired_state for START/STOP requests and sends a hint for START.',
      timeout: ROUTER_TIMEOUT,
      environment: { LEASELOCK_OPERATION_BUDGET_MS: String(ROUTER_OPERATION_BUDGET.toMilliseconds()) },
      statements: [
        // DescribeTable: the cold start's table check (a global table must be MRSC).
        new iam.PolicyStatement({
          actions: ['dynamodb:GetItem', 'dynamodb:UpdateItem', 'dynamodb:DescribeTable'],
          resources: [this.table.tableArn],
        }),
        this.sendHintsStatement(),
        // What the event source mapping below needs, no more (SqsEventSource would grant sqs:GetQueueUrl too).
        new iam.PolicyStatement({
          actions: ['sqs:ReceiveMessage', 'sqs:DeleteMessage', 'sqs:GetQueueAttributes', 'sqs:ChangeMessageVisibility'],
          resources: [this.commandQueue.queueArn],
        }),
      ],
    });
    // No batching window: a command is applied as soon as it is polled. Records the router cannot
    // process yet are reported one by one, not the whole batch.
    this.router.addEventSourceMapping('CommandQueueSource', {
      eventSourceArn: this.commandQueue.queueArn,
      batchSize: COMMAND_BATCH_SIZE,
      reportBatchItemFailures: true,
    });
    this.reconciler = this.leaseFunction('Reconciler', {
      codeDir: props.reconcilerCodeDir ?? path.join(CARGO_LAMBDA_OUTPUT, 'reconciler'),
      description: 'Finds orphaned leases in the sparse index and sends START hints for them.',
      timeout: Duration.seconds(50),
      environment: {
        LEASELOCK_SWEEP_INTERVAL_MINUTES: String(props.sweepIntervalMinutes ?? 10),
        LEASELOCK_SWEEP_GRACE_MS: String((props.sweepGrace ?? Duration.minutes(1)).toMilliseconds()),
      },
      statements: [
        new iam.PolicyStatement({ actions: ['dynamodb:Query'], resources: [this.indexArn] }),
        // The cold start's table check (a global table must be MRSC).
        new iam.PolicyStatement({ actions: ['dynamodb:DescribeTable'], resources: [this.table.tableArn] }),
        // Session mode: a dead session's work, listed in the owner index and read back.
        new iam.PolicyStatement({ actions: ['dynamodb:Query'], resources: [this.ownerIndexArn] }),
        // Session mode: the sweep for stranded work reads the table itself (consistent Scans) and
        // the owners' session items.
        new iam.PolicyStatement({ actions: ['dynamodb:Scan', 'dynamodb:BatchGetItem'], resources: [this.table.tableArn] }),
        this.sendHintsStatement(),
      ],
    });

    const accessLogs = new logs.LogGroup(this, 'ApiAccessLogs', {
      retention: LOG_RETENTION,
      removalPolicy: RemovalPolicy.DESTROY,
    });
    this.api = new apigwv2.HttpApi(this, 'Api', {
      description: 'leaselock router: START/STOP/GET of connections, SigV4-signed requests only.',
      defaultAuthorizer: new HttpIamAuthorizer(),
      createDefaultStage: false,
    });
    new apigwv2.HttpStage(this, 'ApiStage', {
      httpApi: this.api,
      stageName: '$default',
      autoDeploy: true,
      accessLogSettings: {
        destination: new apigwv2.LogGroupLogDestination(accessLogs),
        format: apigw.AccessLogFormat.custom(
          JSON.stringify({
            requestId: '$context.requestId',
            caller: '$context.identity.caller',
            routeKey: '$context.routeKey',
            status: '$context.status',
            latencyMs: '$context.responseLatency',
            error: '$context.error.message',
          }),
        ),
      },
    });
    const routerIntegration = new HttpLambdaIntegration('Router', this.router);
    const routes: Array<[apigwv2.HttpMethod, string]> = [
      [apigwv2.HttpMethod.POST, '/connections/{id}/start'],
      [apigwv2.HttpMethod.POST, '/connections/{id}/stop'],
      [apigwv2.HttpMethod.GET, '/connections/{id}'],
    ];
    for (const [method, routePath] of routes) {
      this.api.addRoutes({ path: routePath, methods: [method], integration: routerIntegration });
    }

    new events.Rule(this, 'ReconcileSchedule', {
      description: 'Runs the leaselock reconciler.',
      schedule: props.reconcileSchedule ?? events.Schedule.rate(Duration.minutes(1)),
      // A missed run needs no retry: the next one queries the same orphans.
      targets: [new targets.LambdaFunction(this.reconciler, { retryAttempts: 0 })],
    });

    this.addAlarms(
      props.orphanAlarmPeriods ?? 5,
      (props.clockSkew ?? Duration.seconds(1)).toMilliseconds(),
      (props.leaseDuration ?? Duration.seconds(20)).toMilliseconds(),
      props.alarmTopic,
    );
    this.addDashboard();

    new CfnOutput(this, 'TableName', {
      value: this.table.tableName,
      description:
        'Lease table (LEASELOCK_TABLE), single-Region. To span Regions, make it a global table in multi-Region ' +
        'strong consistency (MRSC): one in eventual consistency (the default) is refused. Workers need ' +
        'dynamodb:DescribeTable on it for the check at start.',
    });
    new CfnOutput(this, 'IndexName', { value: this.indexName });
    new CfnOutput(this, 'OwnerIndexName', { value: this.ownerIndexName });
    new CfnOutput(this, 'QueueUrl', { value: this.queue.queueUrl });
    new CfnOutput(this, 'DeadLetterQueueUrl', { value: this.deadLetterQueue.queueUrl });
    new CfnOutput(this, 'CommandQueueUrl', { value: this.commandQueue.queueUrl });
    new CfnOutput(this, 'CommandDeadLetterQueueUrl', { value: this.commandDeadLetterQueue.queueUrl });
    new CfnOutput(this, 'ApiUrl', { value: this.api.apiEndpoint });
  }

  /** SendMessageBatch is authorised by sqs:SendMessage. */
  /** A queue (SSE, TLS only) whose messages move to a dead-letter queue of its own after 5 receives. */
  private queueWithDeadLetters(id: string, deadLetterId: string, props: sqs.QueueProps = {}): [sqs.Queue, sqs.Queue] {
    const secure = { encryption: sqs.QueueEncryption.SQS_MANAGED, enforceSSL: true };
    const deadLetters = new sqs.Queue(this, deadLetterId, { ...secure, retentionPeriod: Duration.days(14) });
    const queue = new sqs.Queue(this, id, {
      ...secure,
      ...props,
      deadLetterQueue: { queue: deadLetters, maxReceiveCount: 5 },
    });
    return [queue, deadLetters];
  }

  private sendHintsStatement(): iam.PolicyStatement {
    return new iam.PolicyStatement({ actions: ['sqs:SendMessage'], resources: [this.queue.queueArn] });
  }

  private leaseFunction(
    id: string,
    spec: {
      codeDir: string;
      description: string;
      timeout: Duration;
      statements: iam.PolicyStatement[];
      environment?: Record<string, string>;
    },
  ): lambda.Function {
    if (!fs.existsSync(path.join(spec.codeDir, 'bootstrap'))) {
      throw new Error(
        `${spec.codeDir}/bootstrap not found: run "cargo lambda build --release --arm64" at the repository root`,
      );
    }
    const logGroup = new logs.LogGroup(this, `${id}Logs`, {
      retention: LOG_RETENTION,
      removalPolicy: RemovalPolicy.DESTROY,
    });
    // An own role instead of AWSLambdaBasicExecutionRole: logs go to this log group only.
    const role = new iam.Role(this, `${id}Role`, {
      assumedBy: new iam.ServicePrincipal('lambda.amazonaws.com'),
    });
    logGroup.grantWrite(role);
    spec.statements.forEach((statement) => role.addToPolicy(statement));
    return new lambda.Function(this, id, {
      description: spec.description,
      runtime: lambda.Runtime.PROVIDED_AL2023,
      architecture: lambda.Architecture.ARM_64,
      handler: 'bootstrap',
      code: lambda.Code.fromAsset(spec.codeDir),
      memorySize: 128,
      timeout: spec.timeout,
      role,
      logGroup,
      loggingFormat: lambda.LoggingFormat.JSON,
      environment: { ...this.environment, ...spec.environment },
    });
  }

  private addAlarms(
    orphanAlarmPeriods: number,
    clockSkewMs: number,
    leaseMs: number,
    topic: sns.ITopic | undefined,
  ): void {
    // A worker metric above zero in every minute of WORKER_ALARM_PERIODS (the fleet's sum).
    const everyMinute = (metricName: string, id: string, alarmDescription: string) =>
      leaseMetric(this.metricsNamespace, 'worker', metricName, 'Sum').createAlarm(this, id, {
        alarmDescription,
        threshold: 0,
        comparisonOperator: cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
        evaluationPeriods: WORKER_ALARM_PERIODS,
        treatMissingData: cloudwatch.TreatMissingData.NOT_BREACHING,
      });
    // Any message in a dead-letter queue.
    const deadLetterAlarm = (queue: sqs.Queue, id: string, alarmDescription: string) =>
      queue
        .metricApproximateNumberOfMessagesVisible({ period: Duration.minutes(1), statistic: 'Maximum' })
        .createAlarm(this, id, {
          alarmDescription,
          threshold: 0,
          comparisonOperator: cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
          evaluationPeriods: 1,
          treatMissingData: cloudwatch.TreatMissingData.NOT_BREACHING,
        });
    const alarms = [
      deadLetterAlarm(
        this.deadLetterQueue,
        'DeadLetterQueueAlarm',
        'START hints reached the dead-letter queue after 5 failed receives.',
      ),
      deadLetterAlarm(
        this.commandDeadLetterQueue,
        'CommandDeadLetterQueueAlarm',
        'START/STOP commands reached the command dead-letter queue after 5 failed receives.',
      ),
      // Minimum: every reconciler run in the period found orphans, not just one.
      leaseMetric(this.metricsNamespace, 'reconciler', 'Orphans', 'Minimum').createAlarm(this, 'OrphansAlarm', {
        alarmDescription: 'Started work has had no live lease for several consecutive periods.',
        threshold: 0,
        comparisonOperator: cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
        evaluationPeriods: orphanAlarmPeriods,
        treatMissingData: cloudwatch.TreatMissingData.NOT_BREACHING,
      }),
      // Minimum: every reconciler run in the period was cut short, not just one.
      leaseMetric(this.metricsNamespace, 'reconciler', 'Incomplete', 'Minimum').createAlarm(
        this,
        'ReconcilerIncompleteAlarm',
        {
          alarmDescription:
            `Every reconciler run for ${INCOMPLETE_ALARM_PERIODS} consecutive minutes stopped before reading the whole ` +
            'orphan index or hinting every orphan (cut_short in its logs says why). Raise the reconciler\'s Timeout or ' +
            'memory, or look for DynamoDB/SQS throttling; the next runs pick up the rest.',
          threshold: 0,
          comparisonOperator: cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
          evaluationPeriods: INCOMPLETE_ALARM_PERIODS,
          treatMissingData: cloudwatch.TreatMissingData.NOT_BREACHING,
        },
      ),
      // A worker's clock against the store's, either way (ClockOffsetMs is signed), doubled so
      // that the threshold is the skew itself: the SAM template cannot halve a parameter.
      new cloudwatch.MathExpression({
        expression: '2 * MAX([ABS(ahead), ABS(behind)])',
        label: 'Twice the largest clock offset of a worker to the store (ms)',
        usingMetrics: {
          ahead: leaseMetric(this.metricsNamespace, 'worker', 'ClockOffsetMs', 'Maximum'),
          behind: leaseMetric(this.metricsNamespace, 'worker', 'ClockOffsetMs', 'Minimum'),
        },
        period: Duration.minutes(1),
      }).createAlarm(this, 'ClockOffsetAlarm', {
        alarmDescription:
          `A worker's clock has been off the store's by more than half the clock skew for ${CLOCK_ALARM_PERIODS} ` +
          'minutes (ClockOffsetMs in its metrics, measured from DynamoDB\'s Date header). Its leases run on the ' +
          "store's clock, so they stay exclusive; fix the host's time synchronisation (leaselock clock on the " +
          'host measures it).',
        threshold: clockSkewMs,
        comparisonOperator: cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
        evaluationPeriods: CLOCK_ALARM_PERIODS,
        treatMissingData: cloudwatch.TreatMissingData.NOT_BREACHING,
      }),
      everyMinute(
        'LeasesLost',
        'LeasesLostAlarm',
        `Workers lost leases (a renewal did not succeed before its deadline) in each of ${WORKER_ALARM_PERIODS} ` +
          'consecutive minutes: throttling, a slow store or paused workers (RenewLatency and the workers\' logs say ' +
          'which). The work is claimed again after lease + skew.',
      ),
      everyMinute(
        'AcquireErrors',
        'AcquireErrorsAlarm',
        `Workers' claims failed with errors (not conflicts) in each of ${WORKER_ALARM_PERIODS} consecutive minutes: ` +
          'throttling, permissions or a missing table or index (the workers\' logs name the error).',
      ),
      // The p99 renewal latency against a fifth of the lease: multiplied, as the SAM template
      // cannot divide a parameter.
      new cloudwatch.MathExpression({
        expression: '5 * latency',
        label: 'Five times the p99 renewal latency of the workers (ms)',
        usingMetrics: { latency: leaseMetric(this.metricsNamespace, 'worker', 'RenewLatency', 'p99') },
        period: Duration.minutes(1),
      }).createAlarm(this, 'RenewLatencyAlarm', {
        alarmDescription:
          `The workers' p99 renewal latency has been above a fifth of the lease for ${WORKER_ALARM_PERIODS} ` +
          'consecutive minutes: renewals are at risk of missing their deadlines (a slow or throttled store, ' +
          'overloaded workers).',
        threshold: leaseMs,
        comparisonOperator: cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
        evaluationPeriods: WORKER_ALARM_PERIODS,
        treatMissingData: cloudwatch.TreatMissingData.NOT_BREACHING,
      }),
    ];
    if (topic) {
      alarms.forEach((alarm) => alarm.addAlarmAction(new cloudwatchActions.SnsAction(topic)));
    }
  }

  private addDashboard(): void {
    const ns = this.metricsNamespace;
    const dashboard = new cloudwatch.Dashboard(this, 'Dashboard', {
      dashboardName: `${Stack.of(this).stackName}-leaselock`,
    });
    const width = 12;
    dashboard.addWidgets(
      new cloudwatch.GraphWidget({
        title: 'Reconciler: work by state',
        width: 8,
        left: ['Orphans', 'Started', 'Stopped', 'Owned'].map((name) => leaseMetric(ns, 'reconciler', name, 'Maximum')),
      }),
      new cloudwatch.GraphWidget({
        title: 'Reconciler: hints',
        width: 8,
        left: ['HintsSent', 'HintsFailed', 'HintsDeferred'].map((name) => leaseMetric(ns, 'reconciler', name, 'Sum')),
      }),
      new cloudwatch.GraphWidget({
        title: 'Reconciler: runs cut short (1 = incomplete)',
        width: 8,
        left: [leaseMetric(ns, 'reconciler', 'Incomplete', 'Maximum')],
        leftYAxis: { min: 0, max: 1 },
      }),
    );
    dashboard.addWidgets(
      new cloudwatch.GraphWidget({
        title: 'Workers: active connections per worker',
        width,
        left: [leaseMetric(ns, 'worker', 'ActiveConnections', 'Average')],
      }),
      new cloudwatch.GraphWidget({
        title: 'Workers: lease events',
        width,
        left: ['Acquired', 'AcquireConflicts', 'LeasesLost'].map((name) => leaseMetric(ns, 'worker', name, 'Sum')),
      }),
    );
    dashboard.addWidgets(
      new cloudwatch.GraphWidget({
        title: 'Workers: renew latency (ms)',
        width: 2 * width,
        left: ['p50', 'p99'].map((stat) => leaseMetric(ns, 'worker', 'RenewLatency', stat)),
      }),
    );
  }
}
