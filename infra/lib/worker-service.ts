import { Duration, RemovalPolicy, Validations } from 'aws-cdk-lib';
import * as ec2 from 'aws-cdk-lib/aws-ec2';
import * as ecs from 'aws-cdk-lib/aws-ecs';
import * as iam from 'aws-cdk-lib/aws-iam';
import * as logs from 'aws-cdk-lib/aws-logs';
import { Construct } from 'constructs';
import { LeaseCoordinator } from './lease-coordinator';
import { leaseMetric } from './metrics';

/** Fargate's ceiling for a container's stop timeout. */
const MAX_STOP_TIMEOUT = Duration.seconds(120);

export interface WorkerServiceProps {
  /** The table, index and queue the workers lease from. */
  readonly coordinator: LeaseCoordinator;
  /** The worker container; it must release its leases on SIGTERM. */
  readonly image: ecs.ContainerImage;
  /** Worker-specific variables added to the coordinator's LEASELOCK_* ones. @default - none */
  readonly environment?: Record<string, string>;
  /** @default - a new two-AZ VPC with one NAT gateway and a DynamoDB gateway endpoint */
  readonly vpc?: ec2.IVpc;
  /** @default ecs.CpuArchitecture.ARM64, like the Lambdas */
  readonly cpuArchitecture?: ecs.CpuArchitecture;
  /** @default 256 */
  readonly cpu?: number;
  /** @default 512 */
  readonly memoryLimitMiB?: number;
  /** @default 2 */
  readonly minTasks?: number;
  /** @default 10 */
  readonly maxTasks?: number;
  /** Average ActiveConnections per task that scaling aims for. @default 500 */
  readonly targetConnectionsPerTask?: number;
  /**
   * Time between SIGTERM and SIGKILL: the worker cancels its handlers and releases every lease in
   * it. At most 120 s (Fargate's limit). @default Duration.seconds(30)
   */
  readonly stopTimeout?: Duration;
}

/** A Fargate fleet of leaselock workers, scaled on the connections each task holds. */
export class WorkerService extends Construct {
  readonly service: ecs.FargateService;
  readonly taskDefinition: ecs.FargateTaskDefinition;

  constructor(scope: Construct, id: string, props: WorkerServiceProps) {
    super(scope, id);
    const stopTimeout = props.stopTimeout ?? Duration.seconds(30);
    if (stopTimeout.toSeconds() > MAX_STOP_TIMEOUT.toSeconds()) {
      throw new Error(`stopTimeout ${stopTimeout.toSeconds()} s is above Fargate's limit of 120 s`);
    }
    const { coordinator } = props;

    const vpc =
      props.vpc ??
      new ec2.Vpc(this, 'Vpc', {
        maxAzs: 2,
        natGateways: 1,
        restrictDefaultSecurityGroup: false,
        flowLogs: { All: { trafficType: ec2.FlowLogTrafficType.ALL } },
        // Lease traffic stays off the NAT gateway.
        gatewayEndpoints: { DynamoDb: { service: ec2.GatewayVpcEndpointAwsService.DYNAMODB } },
      });
    const cluster = new ecs.Cluster(this, 'Cluster', {
      vpc,
      containerInsightsV2: ecs.ContainerInsights.ENABLED,
    });

    this.taskDefinition = new ecs.FargateTaskDefinition(this, 'TaskDefinition', {
      cpu: props.cpu ?? 256,
      memoryLimitMiB: props.memoryLimitMiB ?? 512,
      runtimePlatform: {
        cpuArchitecture: props.cpuArchitecture ?? ecs.CpuArchitecture.ARM64,
        operatingSystemFamily: ecs.OperatingSystemFamily.LINUX,
      },
    });
    const logGroup = new logs.LogGroup(this, 'Logs', {
      retention: logs.RetentionDays.ONE_MONTH,
      removalPolicy: RemovalPolicy.DESTROY,
    });
    this.taskDefinition.addContainer('Worker', {
      image: props.image,
      environment: { ...coordinator.environment, ...props.environment },
      logging: ecs.LogDrivers.awsLogs({ streamPrefix: 'worker', logGroup }),
      stopTimeout,
      // An init process as PID 1 passes ECS's SIGTERM on to the worker and reaps its children.
      linuxParameters: new ecs.LinuxParameters(this, 'LinuxParameters', { initProcessEnabled: true }),
    });

    const role = this.taskDefinition.taskRole;
    role.addToPrincipalPolicy(
      new iam.PolicyStatement({
        // acquire, renew, release, checkpoint, get, the batched desired-state check, the table
        // check at start (DescribeTable: a global table must be MRSC), and the ConditionCheck on
        // the lease item that session mode's takeovers and fenced writes put in a transaction.
        actions: [
          'dynamodb:GetItem',
          'dynamodb:UpdateItem',
          'dynamodb:BatchGetItem',
          'dynamodb:DescribeTable',
          'dynamodb:ConditionCheckItem',
        ],
        resources: [coordinator.table.tableArn],
      }),
    );
    role.addToPrincipalPolicy(
      // Orphans; an owner's leases.
      new iam.PolicyStatement({ actions: ['dynamodb:Query'], resources: [coordinator.indexArn, coordinator.ownerIndexArn] }),
    );
    role.addToPrincipalPolicy(
      new iam.PolicyStatement({
        // Hints in; on SIGTERM, the released work hinted to the rest of the fleet.
        actions: ['sqs:ReceiveMessage', 'sqs:DeleteMessage', 'sqs:ChangeMessageVisibility', 'sqs:SendMessage'],
        resources: [coordinator.queue.queueArn],
      }),
    );

    this.service = new ecs.FargateService(this, 'Service', {
      cluster,
      taskDefinition: this.taskDefinition,
      // New tasks start before old ones get SIGTERM, so released leases find a taker at once.
      minHealthyPercent: 100,
      maxHealthyPercent: 200,
      circuitBreaker: { rollback: true },
    });
    this.service
      .autoScaleTaskCount({ minCapacity: props.minTasks ?? 2, maxCapacity: props.maxTasks ?? 10 })
      .scaleToTrackCustomMetric('ActiveConnectionsPerTask', {
        // Every task reports its own count under one dimension, so the average is per task.
        metric: leaseMetric(coordinator.metricsNamespace, 'worker', 'ActiveConnections', 'Average'),
        targetValue: props.targetConnectionsPerTask ?? 500,
      });

    Validations.of(this.taskDefinition).acknowledge({
      id: 'AwsSolutions-ECS2',
      reason: 'The variables are resource names and lease timings, none of them secret.',
    });
    Validations.of(this.taskDefinition).acknowledge({
      id: 'AwsSolutions-IAM5[Resource::*]',
      reason: 'ecr:GetAuthorizationToken, granted for a private ECR image, has no resource-level permissions.',
    });
  }
}
