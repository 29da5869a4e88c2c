import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { CfnElement, Duration, Stack } from 'aws-cdk-lib';
import { Match, Template } from 'aws-cdk-lib/assertions';
import * as ecs from 'aws-cdk-lib/aws-ecs';
import { IConstruct } from 'constructs';
import { LeaseCoordinator } from '../lib/lease-coordinator';
import { WorkerService, WorkerServiceProps } from '../lib/worker-service';
import { placeholderCodeDirs, testApp } from './fixtures';

function synth(props: Partial<WorkerServiceProps> = {}) {
  const stack = new Stack(testApp(), 'Test');
  const coordinator = new LeaseCoordinator(stack, 'Coordinator', placeholderCodeDirs());
  const workers = new WorkerService(stack, 'Workers', {
    coordinator,
    image: ecs.ContainerImage.fromRegistry('example/worker:1'),
    ...props,
  });
  return { stack, coordinator, workers, template: Template.fromStack(stack) };
}

const arnOf = (stack: Stack, construct: IConstruct) => ({
  'Fn::GetAtt': [stack.getLogicalId(construct.node.defaultChild as CfnElement), 'Arn'],
});

function containerOf(template: Template) {
  const [taskDefinition] = Object.values(template.findResources('AWS::ECS::TaskDefinition'));
  const [container] = taskDefinition.Properties.ContainerDefinitions;
  return container;
}

describe('WorkerService', () => {
  test('scales on the average ActiveConnections per task, aiming at 500 by default', () => {
    const scalingPolicy = (target: number) => ({
      PolicyType: 'TargetTrackingScaling',
      TargetTrackingScalingPolicyConfiguration: {
        CustomizedMetricSpecification: {
          Namespace: 'leaselock',
          MetricName: 'ActiveConnections',
          Dimensions: [{ Name: 'Service', Value: 'worker' }],
          Statistic: 'Average',
        },
        TargetValue: target,
      },
    });
    synth().template.hasResourceProperties('AWS::ApplicationAutoScaling::ScalingPolicy', scalingPolicy(500));
    synth({ targetConnectionsPerTask: 200 }).template.hasResourceProperties(
      'AWS::ApplicationAutoScaling::ScalingPolicy',
      scalingPolicy(200),
    );
  });

  test('scales between the given task counts', () => {
    synth({ minTasks: 3, maxTasks: 7 }).template.hasResourceProperties('AWS::ApplicationAutoScaling::ScalableTarget', {
      MinCapacity: 3,
      MaxCapacity: 7,
      ScalableDimension: 'ecs:service:DesiredCount',
    });
  });

  test('gives the worker 30 s between SIGTERM and SIGKILL to release its leases, behind an init process', () => {
    const container = containerOf(synth().template);
    assert.equal(container.StopTimeout, 30);
    assert.equal(container.LinuxParameters.InitProcessEnabled, true);
    assert.equal(containerOf(synth({ stopTimeout: Duration.seconds(90) }).template).StopTimeout, 90);
  });

  test("refuses a stop timeout above Fargate's 120 s", () => {
    assert.throws(() => synth({ stopTimeout: Duration.seconds(121) }), /above Fargate's limit of 120 s/);
  });

  test("passes the coordinator's LEASELOCK_* variables and the worker's own", () => {
    const { stack, coordinator, template } = synth({ environment: { LEASELOCK_MAX_CONNECTIONS: '800' } });
    const variables = Object.fromEntries(
      containerOf(template).Environment.map((v: { Name: string; Value: unknown }) => [v.Name, v.Value]),
    );
    assert.deepEqual(variables, {
      ...stack.resolve(coordinator.environment),
      LEASELOCK_MAX_CONNECTIONS: '800',
    });
    assert.deepEqual(Object.keys(variables).sort(), [
      'LEASELOCK_CLOCK_SKEW_MS',
      'LEASELOCK_INDEX_NAME',
      'LEASELOCK_KEY_PREFIX',
      'LEASELOCK_LEASE_MS',
      'LEASELOCK_MAX_CONNECTIONS',
      'LEASELOCK_METRICS_NAMESPACE',
      'LEASELOCK_OWNER_INDEX_NAME',
      'LEASELOCK_QUEUE_URL',
      'LEASELOCK_RENEW_MS',
      'LEASELOCK_TABLE',
    ]);
  });

  test('the task role reaches only the lease items, the orphan index and the hint queue', () => {
    const { stack, coordinator, workers, template } = synth();
    const taskRole = stack.getLogicalId(workers.taskDefinition.taskRole.node.defaultChild as CfnElement);
    template.hasResourceProperties('AWS::IAM::Policy', {
      Roles: [{ Ref: taskRole }],
      PolicyDocument: {
        Statement: [
          {
            Action: [
              'dynamodb:GetItem',
              'dynamodb:UpdateItem',
              'dynamodb:BatchGetItem',
              'dynamodb:DescribeTable',
              'dynamodb:ConditionCheckItem',
            ],
            Effect: 'Allow',
            Resource: arnOf(stack, coordinator.table),
          },
          {
            Action: 'dynamodb:Query',
            Effect: 'Allow',
            Resource: [
              { 'Fn::Join': ['', [arnOf(stack, coordinator.table), '/index/desired_state-lease_expires_at_ms-index']] },
              { 'Fn::Join': ['', [arnOf(stack, coordinator.table), '/index/lease_owner-index']] },
            ],
          },
          {
            Action: ['sqs:ReceiveMessage', 'sqs:DeleteMessage', 'sqs:ChangeMessageVisibility', 'sqs:SendMessage'],
            Effect: 'Allow',
            Resource: arnOf(stack, coordinator.queue),
          },
        ],
      },
    });
  });

  test('deploys new tasks before stopping old ones, and rolls back a failing deployment', () => {
    synth().template.hasResourceProperties('AWS::ECS::Service', {
      LaunchType: 'FARGATE',
      DeploymentConfiguration: Match.objectLike({
        MinimumHealthyPercent: 100,
        MaximumPercent: 200,
        DeploymentCircuitBreaker: { Enable: true, Rollback: true },
      }),
    });
  });

  test('runs arm64 tasks by default', () => {
    synth().template.hasResourceProperties('AWS::ECS::TaskDefinition', {
      RuntimePlatform: { CpuArchitecture: 'ARM64', OperatingSystemFamily: 'LINUX' },
    });
  });
});
